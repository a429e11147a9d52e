-- Frozen by scripts/stamp_functions.py: db/functions/*.sql as released in v0.2.0.
-- Never edit: deployed databases recorded this script.
BEGIN;
-- The lock pgmigrate takes (pgmigrate.yml): a sqitch deploy and a
-- `switchboard migrate` on the same database never interleave.
SELECT pg_advisory_xact_lock(hashtext('switchboard.migrate'));

-- db/functions/10_cron.sql
-- Cron schedules: parsing, validation and "next fire time", in PL/pgSQL.
--
-- cron_next() runs inside every scheduler claim, so it is built for speed
-- (bench/cron_bench.py: 10-20x faster per call than croniter's get_next). An
-- expression is parsed into five bitmasks with plain string functions
-- (string_to_array, ltrim, split_part; a regexp only off the common path),
-- and the next fire time is found by jumping field by field -- next matching
-- month, then day, then hour, then minute -- with "lowest set bit at or
-- above n" done in one expression (x & -x isolates the bit, ln() gives its
-- index). A month costs a handful of statements whatever the expression;
-- nothing ever walks minute by minute.
--
-- Semantics are Vixie cron's (cronie, pg_cron):
--   * fields: minute 0-59, hour 0-23, day-of-month 1-31, month 1-12 (JAN-DEC),
--     day-of-week 0-7 (SUN-SAT, 7 = Sunday); `*`, lists, ranges, `/step`;
--     `a/step` means `a-<max>/step` (for day-of-week max is 7, as `*` is 0-7).
--   * when both day fields are restricted a day matches if EITHER matches; a
--     day field whose text starts with `*` (`*`, `*/2`) counts as
--     unrestricted, and then both must match.
--   * the expression is read in local wall time of the task's zone. A local
--     time skipped by a DST jump fires at the first instant after the jump; a
--     local time that happens twice fires once, at its first occurrence.
--
-- Parallel safety: nothing on cron_next's path opens a subtransaction (an
-- EXCEPTION block), because PostgreSQL 15 refuses those in parallel mode. So
-- the two errors PostgreSQL raises itself keep its own wording when they come
-- out of cron_next -- an unknown zone (22023, `time zone "X" not recognized`)
-- and unparsable `@every` text (22007). cron_validate(), which create_task
-- calls, catches both and re-raises 22023 with a HINT.

-- _cron_field: one field's text -> bitmask (bit n set = value n allowed;
-- day-of-week 7 folded into 0). The general path for lists, ranges, steps and
-- names; _cron_parse handles `*` and a lone number itself, which is what most
-- fields are. Raises 22023 naming the field, its text and the expression.
CREATE OR REPLACE FUNCTION switchboard._cron_field(fld text, i integer, expr text)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $fn$
DECLARE
    lo    integer := CASE WHEN i IN (3, 4) THEN 1 ELSE 0 END;
    hi    integer := CASE i WHEN 1 THEN 59 WHEN 2 THEN 23 WHEN 3 THEN 31 WHEN 4 THEN 12 ELSE 7 END;
    m     bigint := 0;
    item  text;
    rng   text;
    a     integer;
    b     integer;
    step  integer;
    k     integer;
BEGIN
    FOREACH item IN ARRAY string_to_array(fld, ',') LOOP
        step := 1;
        rng := item;
        IF strpos(item, '/') > 0 THEN
            rng := split_part(item, '/', 1);
            step := CASE WHEN split_part(item, '/', 2) ~ '^[0-9]{1,4}$' AND split_part(item, '/', 3) = ''
                         THEN split_part(item, '/', 2)::integer ELSE 0 END;
        END IF;
        IF rng = '*' THEN
            a := lo;
            b := hi;
        ELSE
            -- a value is digits or, for month and day-of-week, a three-letter
            -- name; anything else becomes -1, which fails the range check
            a := CASE
                WHEN split_part(rng, '-', 1) ~ '^[0-9]{1,2}$' THEN split_part(rng, '-', 1)::integer
                WHEN i = 4 AND length(split_part(rng, '-', 1)) = 3
                     AND strpos('janfebmaraprmayjunjulaugsepoctnovdec', split_part(rng, '-', 1)) % 3 = 1
                    THEN strpos('janfebmaraprmayjunjulaugsepoctnovdec', split_part(rng, '-', 1)) / 3 + 1
                WHEN i = 5 AND length(split_part(rng, '-', 1)) = 3
                     AND strpos('sunmontuewedthufrisat', split_part(rng, '-', 1)) % 3 = 1
                    THEN strpos('sunmontuewedthufrisat', split_part(rng, '-', 1)) / 3
                ELSE -1 END;
            IF strpos(rng, '-') > 0 THEN
                b := CASE
                    WHEN rng LIKE '%-%-%' THEN -1
                    WHEN split_part(rng, '-', 2) ~ '^[0-9]{1,2}$' THEN split_part(rng, '-', 2)::integer
                    WHEN i = 4 AND length(split_part(rng, '-', 2)) = 3
                         AND strpos('janfebmaraprmayjunjulaugsepoctnovdec', split_part(rng, '-', 2)) % 3 = 1
                        THEN strpos('janfebmaraprmayjunjulaugsepoctnovdec', split_part(rng, '-', 2)) / 3 + 1
                    WHEN i = 5 AND length(split_part(rng, '-', 2)) = 3
                         AND strpos('sunmontuewedthufrisat', split_part(rng, '-', 2)) % 3 = 1
                        THEN strpos('sunmontuewedthufrisat', split_part(rng, '-', 2)) / 3
                    ELSE -1 END;
            ELSIF strpos(item, '/') > 0 THEN
                b := hi;                    -- `a/step` means `a-max/step`
            ELSE
                b := a;
            END IF;
        END IF;
        IF step < 1 OR a < lo OR b > hi OR b < a THEN
            RAISE EXCEPTION 'invalid cron % field "%" in "%"',
                    (ARRAY['minute', 'hour', 'day-of-month', 'month', 'day-of-week'])[i],
                    (regexp_split_to_array(btrim(expr, E' \t\r\n\f\013'), '\s+'))[i], expr
                USING ERRCODE = '22023',
                      HINT = format('The %s field takes %s: *, a value, a list (a,b), a range '
                                    '(low-high) and an optional step (*/n, a-b/n, a/n; n >= 1).',
                                    (ARRAY['minute', 'hour', 'day-of-month', 'month', 'day-of-week'])[i],
                                    (ARRAY['0-59', '0-23', '1-31', '1-12 or JAN-DEC',
                                           '0-7 or SUN-SAT (0 and 7 are Sunday)'])[i]);
        END IF;
        -- bits a, a+s, ..., a+ks (k = (b-a)/s): a geometric series,
        -- 1 + 2^s * (2^(ks) - 1) / (2^s - 1), kept below 2^60
        k := (b - a) / step;
        m := m | CASE WHEN k = 0 THEN 1::bigint << a
                      ELSE (1 + ((((1::bigint << (k * step)) - 1) / ((1::bigint << step) - 1)) << step)) << a END;
    END LOOP;
    IF i = 5 THEN
        m := (m | (m >> 7)) & 127;          -- 7 is Sunday
    END IF;
    RETURN m;
END
$fn$;

-- _cron_parse: expression -> {minutes, hours, days-of-month, months,
-- days-of-week, flags} as bigint bitmasks; flags = 1 selects the AND day rule
-- (a day field starts with `*`). A bigint[] is the cheapest thing for
-- PL/pgSQL to return and index. Parsing is most of what cron_next costs, so
-- the common shapes take one cheap expression each: macros are constants, a
-- field that is `*`, a lone number or (minutes, hours) `*/n` never reaches
-- _cron_field (the step mask is a geometric series in closed form), and the
-- split is string_to_array (a regexp split costs several times more).
-- Rejects what can never fire, so a stored schedule always has a next time.
CREATE OR REPLACE FUNCTION switchboard._cron_parse(expr text)
RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $fn$
DECLARE
    s   text := lower(btrim(translate(expr, E'\t\n\r\f\013', '     '), ' '));
    f   text[];
    mn  bigint;
    hr  bigint;
    dd  bigint;
    mo  bigint;
    wd  bigint;
BEGIN
    IF left(s, 1) = '@' THEN
        CASE s
            WHEN '@hourly'   THEN RETURN '{1,16777215,4294967294,8190,127,1}';
            WHEN '@daily'    THEN RETURN '{1,1,4294967294,8190,127,1}';
            WHEN '@midnight' THEN RETURN '{1,1,4294967294,8190,127,1}';
            WHEN '@weekly'   THEN RETURN '{1,1,4294967294,8190,1,1}';
            WHEN '@monthly'  THEN RETURN '{1,1,2,8190,127,1}';
            WHEN '@yearly'   THEN RETURN '{1,1,2,2,127,1}';
            WHEN '@annually' THEN RETURN '{1,1,2,2,127,1}';
            ELSE
                IF s ~ '^@every(\s|$)' THEN
                    RAISE EXCEPTION '"%" is an @every schedule, not a cron expression', expr
                        USING ERRCODE = '22023',
                              HINT = 'switchboard._every_interval() reads @every schedules.';
                END IF;
                RAISE EXCEPTION 'unknown cron macro "%"', split_part(s, ' ', 1)
                    USING ERRCODE = '22023',
                          HINT = 'Macros are @yearly, @annually, @monthly, @weekly, @daily, '
                                 '@midnight, @hourly and @every <interval>.';
        END CASE;
    END IF;

    f := string_to_array(s, ' ');
    IF array_length(f, 1) <> 5 THEN
        f := array_remove(f, '');           -- runs of blanks
    END IF;
    IF coalesce(array_length(f, 1), 0) <> 5 THEN
        RAISE EXCEPTION 'invalid cron expression "%": expected 5 fields, got %', expr,
                coalesce(array_length(f, 1), 0)
            USING ERRCODE = '22023',
                  HINT = 'Five fields: minute hour day-of-month month day-of-week, e.g. '
                         '"*/15 9-17 * * MON-FRI"; or a macro such as @daily or @every 5 minutes.';
    END IF;

    mn := CASE WHEN f[1] = '*' THEN 1152921504606846975
               WHEN length(f[1]) <= 2 AND ltrim(f[1], '0123456789') = '' AND f[1]::integer <= 59
                   THEN 1::bigint << f[1]::integer
               WHEN left(f[1], 2) = '*/' AND length(f[1]) BETWEEN 3 AND 4
                    AND ltrim(substr(f[1], 3), '0123456789') = ''
                    AND substr(f[1], 3)::integer BETWEEN 1 AND 59
                   THEN 1 + ((((1::bigint << (59 / substr(f[1], 3)::integer * substr(f[1], 3)::integer)) - 1)
                             / ((1::bigint << substr(f[1], 3)::integer) - 1)) << substr(f[1], 3)::integer) END;
    IF mn IS NULL THEN
        mn := switchboard._cron_field(f[1], 1, expr);
    END IF;
    hr := CASE WHEN f[2] = '*' THEN 16777215
               WHEN length(f[2]) <= 2 AND ltrim(f[2], '0123456789') = '' AND f[2]::integer <= 23
                   THEN 1::bigint << f[2]::integer
               WHEN left(f[2], 2) = '*/' AND length(f[2]) BETWEEN 3 AND 4
                    AND ltrim(substr(f[2], 3), '0123456789') = ''
                    AND substr(f[2], 3)::integer BETWEEN 1 AND 23
                   THEN 1 + ((((1::bigint << (23 / substr(f[2], 3)::integer * substr(f[2], 3)::integer)) - 1)
                             / ((1::bigint << substr(f[2], 3)::integer) - 1)) << substr(f[2], 3)::integer) END;
    IF hr IS NULL THEN
        hr := switchboard._cron_field(f[2], 2, expr);
    END IF;
    dd := CASE WHEN f[3] = '*' THEN 4294967294
               WHEN length(f[3]) <= 2 AND ltrim(f[3], '0123456789') = ''
                    AND f[3]::integer BETWEEN 1 AND 31
                   THEN 1::bigint << f[3]::integer END;
    IF dd IS NULL THEN
        dd := switchboard._cron_field(f[3], 3, expr);
    END IF;
    mo := CASE WHEN f[4] = '*' THEN 8190
               WHEN length(f[4]) <= 2 AND ltrim(f[4], '0123456789') = ''
                    AND f[4]::integer BETWEEN 1 AND 12
                   THEN 1::bigint << f[4]::integer END;
    IF mo IS NULL THEN
        mo := switchboard._cron_field(f[4], 4, expr);
    END IF;
    wd := CASE WHEN f[5] = '*' THEN 127
               WHEN length(f[5]) = 1 AND ltrim(f[5], '01234567') = ''
                   THEN 1::bigint << (f[5]::integer % 7) END;
    IF wd IS NULL THEN
        wd := switchboard._cron_field(f[5], 5, expr);
    END IF;

    -- Never fires: under the AND rule some day of the month must exist in
    -- one of the months (31-day months 5546, 30-day months 2640, February 4
    -- with up to 29 days); every (day, weekday) pairing then recurs. Under the
    -- OR rule the weekday part fires every week.
    IF (left(f[3], 1) = '*' OR left(f[5], 1) = '*')
       AND NOT ((mo & 5546) <> 0
                OR ((mo & 2640) <> 0 AND (dd & 2147483646) <> 0)
                OR ((mo & 4) <> 0 AND (dd & 1073741822) <> 0)) THEN
        RAISE EXCEPTION 'cron expression "%" never fires', expr
            USING ERRCODE = '22023',
                  HINT = 'None of its days of the month occur in its months (like 30 2 or 31 4).';
    END IF;
    RETURN ARRAY[mn, hr, dd, mo, wd, (left(f[3], 1) = '*' OR left(f[5], 1) = '*')::integer];
END
$fn$;

-- _every_interval: the period of an `@every <interval>` schedule, NULL for
-- any other schedule. Days count as 24 hours (the rate is fixed, DST or not),
-- months and years are refused: they have no fixed length.
CREATE OR REPLACE FUNCTION switchboard._every_interval(schedule text)
RETURNS interval
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
AS $fn$
DECLARE
    s  text := btrim(translate(schedule, E'\t\n\r\f\013', '     '), ' ');
    iv interval;
BEGIN
    IF lower(left(s, 6)) <> '@every' OR length(s) > 6 AND substr(s, 7, 1) <> ' ' THEN
        RETURN NULL;                        -- not @every (or "@everyday": not ours)
    END IF;
    s := btrim(substr(s, 7), ' ');
    IF s = '' THEN
        RAISE EXCEPTION 'invalid @every schedule "%": no interval', schedule
            USING ERRCODE = '22023', HINT = 'Write e.g. "@every 30 seconds" or "@every 5 minutes".';
    END IF;
    iv := s::interval;
    IF date_part('year', iv) <> 0 OR date_part('month', iv) <> 0 THEN
        RAISE EXCEPTION 'invalid @every schedule "%": months and years have no fixed length', schedule
            USING ERRCODE = '22023',
                  HINT = 'Use a cron expression instead, e.g. "0 0 1 * *" for monthly.';
    END IF;
    iv := date_part('epoch', iv) * interval '1 second';
    IF iv <= interval '0' THEN
        RAISE EXCEPTION 'invalid @every schedule "%": the interval must be positive', schedule
            USING ERRCODE = '22023', HINT = 'Write e.g. "@every 30 seconds" or "@every 5 minutes".';
    END IF;
    RETURN iv;
END
$fn$;

-- cron_next: one function for every schedule kind, so callers never branch.
-- The search runs on integer wall-clock fields (year, month, day, hour,
-- minute) and only turns a candidate into an instant at the end; in UTC that
-- is the whole story. Elsewhere the candidate is checked against the zone:
-- a wall time inside a spring-forward gap becomes the transition instant
-- (binary search on seconds, only ever on a DST day), and a wall time inside
-- a fall-back overlap becomes its first occurrence; a candidate whose first
-- occurrence is not after `after` has already fired, and the search moves on.
CREATE OR REPLACE FUNCTION switchboard.cron_next(schedule text, after timestamptz DEFAULT now(),
                                                 timezone text DEFAULT 'UTC')
RETURNS timestamptz
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
AS $fn$
DECLARE
    p      bigint[];
    mins   bigint;
    hrs    bigint;
    doms   bigint;
    mons   bigint;
    dows   bigint;
    anded  boolean;
    utc    boolean;
    loc    timestamp;
    y      integer;
    mo     integer;
    d      integer;
    h      integer;
    mi     integer;
    w      integer;
    ylim   integer;
    dmkey  integer := -1;
    dm     bigint;
    x      bigint;
    n      integer;
    lt     timestamp;
    u      timestamptz;
    g      double precision;
    lo_e   double precision;
    hi_e   double precision;
    mid    double precision;
BEGIN
    IF lower(left(ltrim(schedule, E' \t\n\r\f\013'), 6)) = '@every' THEN
        g := date_part('epoch', switchboard._every_interval(schedule));
        IF g IS NOT NULL THEN                   -- else "@everyday": unknown macro below
            RETURN after + g * interval '1 second';
        END IF;
    END IF;
    IF NOT isfinite(after) THEN
        RAISE EXCEPTION 'cron_next: "after" must be a finite timestamp, not %', after
            USING ERRCODE = '22023', HINT = 'Pass a real point in time, e.g. now().';
    END IF;
    p := switchboard._cron_parse(schedule);
    mins := p[1]; hrs := p[2]; doms := p[3]; mons := p[4]; dows := p[5]; anded := p[6] <> 0;

    utc := timezone = 'UTC' OR upper(timezone) IN ('UTC', 'ETC/UTC', 'GMT', 'ETC/GMT', 'UCT', 'ETC/UCT',
                               'UNIVERSAL', 'ETC/UNIVERSAL', 'ZULU', 'ETC/ZULU');
    IF utc THEN
        loc := date_trunc('minute', after AT TIME ZONE 'UTC') + interval '1 minute';
    ELSE
        loc := date_trunc('minute', after AT TIME ZONE timezone) + interval '1 minute';
    END IF;
    y := date_part('year', loc);
    mo := date_part('month', loc);
    d := date_part('day', loc);
    h := date_part('hour', loc);
    mi := date_part('minute', loc);
    -- Every (month, day, weekday) combination recurs within 400 years, and
    -- _cron_parse has refused what never fires; this bound only stops a bug.
    ylim := y + 400;

    LOOP
        IF ((mons >> mo) & 1) = 0 THEN
            x := mons & -(1::bigint << mo);
            IF x = 0 THEN
                y := y + 1;
                x := mons;
                IF y > ylim THEN
                    RAISE EXCEPTION 'cron expression "%" never fires', schedule
                        USING ERRCODE = '22023',
                              HINT = 'No matching time within 400 years of the start.';
                END IF;
            END IF;
            mo := round(ln((x & -x)::double precision) * 1.4426950408889634);
            d := 1; h := 0; mi := 0;
        END IF;
        IF dmkey <> y * 16 + mo THEN
            -- days of this month that match: the weekday mask rotated to the
            -- weekday of the 1st and repeated five times (the multiplier is
            -- 1 + 2^7 + 2^14 + 2^21 + 2^28), combined with the day-of-month
            -- mask by Vixie's rule, cut to the month's length
            dmkey := y * 16 + mo;
            w := date_part('dow', make_date(y, mo, 1));
            dm := (((((dows >> w) | (dows << (7 - w))) & 127) * 270549121) << 1);
            dm := CASE WHEN anded THEN doms & dm ELSE doms | dm END
                  & ((2::bigint << CASE WHEN mo = 2
                                        THEN 28 + (y % 4 = 0 AND (y % 100 <> 0 OR y % 400 = 0))::integer
                                        ELSE 30 + ((mo + (mo >> 3)) & 1) END) - 2);
        END IF;
        x := dm & -(1::bigint << d);
        IF x = 0 THEN
            mo := mo + 1; d := 1; h := 0; mi := 0;
            CONTINUE;
        END IF;
        n := round(ln((x & -x)::double precision) * 1.4426950408889634);
        IF n > d THEN
            d := n; h := 0; mi := 0;
        END IF;
        x := hrs & -(1::bigint << h);
        IF x = 0 THEN
            d := d + 1; h := 0; mi := 0;
            CONTINUE;
        END IF;
        n := round(ln((x & -x)::double precision) * 1.4426950408889634);
        IF n > h THEN
            h := n; mi := 0;
        END IF;
        x := mins & -(1::bigint << mi);
        IF x = 0 THEN
            h := h + 1; mi := 0;
            CONTINUE;
        END IF;
        mi := round(ln((x & -x)::double precision) * 1.4426950408889634);

        IF utc THEN
            RETURN make_timestamp(y, mo, d, h, mi, 0) AT TIME ZONE 'UTC';
        END IF;

        lt := make_timestamp(y, mo, d, h, mi, 0);
        -- PostgreSQL reads a wall time in a gap with the offset from before
        -- the jump, and one in an overlap with the offset from after it.
        u := lt AT TIME ZONE timezone;
        g := date_part('epoch', (u AT TIME ZONE timezone) - lt);
        IF g <> 0 THEN
            -- lt was skipped: the transition instant lies within |g| of u;
            -- it is the first instant whose wall time is later than lt.
            lo_e := date_part('epoch', u) - abs(g);
            hi_e := date_part('epoch', u) + abs(g);
            WHILE hi_e - lo_e > 1 LOOP
                mid := floor((lo_e + hi_e) / 2);
                IF (to_timestamp(mid) AT TIME ZONE timezone) >= lt THEN
                    hi_e := mid;
                ELSE
                    lo_e := mid;
                END IF;
            END LOOP;
            u := to_timestamp(hi_e);
        ELSE
            -- If the offset 24 hours earlier was larger, the clocks went back
            -- within the day; lt may have happened once before, by that much.
            g := date_part('epoch', ((u - interval '24 hours') AT TIME ZONE timezone) - lt) + 86400;
            IF g > 0 AND ((u - g * interval '1 second') AT TIME ZONE timezone) = lt THEN
                u := u - g * interval '1 second';
            END IF;
        END IF;
        IF u > after THEN
            RETURN u;
        END IF;
        -- the first occurrence of lt is not after `after`: lt already fired
        mi := mi + 1;
    END LOOP;
END
$fn$;

COMMENT ON FUNCTION switchboard.cron_next(text, timestamptz, text) IS
'Next fire time strictly after `after` for a 5-field cron expression, a macro (@hourly, @daily, '
'@weekly, @monthly, @yearly) or @every <interval> (after + interval), read in local time of '
'`timezone`. Vixie day rules. Skipped local times fire at the DST jump; repeated ones fire once. '
'NULL schedule -> NULL. Invalid or never-firing -> 22023.';
REVOKE ALL ON FUNCTION switchboard.cron_next(text, timestamptz, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.cron_next(text, timestamptz, text) TO switchboard_app;

-- _check_timezone: the one zone rule (create_task, update_task and
-- cron_validate all use it). A zone is valid iff "AT TIME ZONE" accepts it,
-- which is exactly what cron_next will do with it later: IANA names in any
-- case (utc, europe/berlin), POSIX zones, abbreviations. PostgreSQL caches
-- loaded zones, so this costs microseconds; the old check scanned
-- pg_timezone_names (reads every zone file: ~30 ms per call) and, being
-- case-sensitive, refused 'utc' although cron_validate accepted it.
CREATE OR REPLACE FUNCTION switchboard._check_timezone(timezone text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF timezone IS NULL THEN
        RAISE EXCEPTION 'time zone must not be NULL'
            USING ERRCODE = '22023', HINT = 'Use an IANA name such as UTC or Europe/Berlin.';
    END IF;
    BEGIN
        PERFORM now() AT TIME ZONE timezone;
    EXCEPTION WHEN invalid_parameter_value THEN
        RAISE EXCEPTION 'unknown time zone "%"', timezone
            USING ERRCODE = '22023',
                  HINT = 'Use an IANA name such as UTC or Europe/Berlin; see pg_timezone_names.';
    END;
END
$fn$;
COMMENT ON FUNCTION switchboard._check_timezone(text) IS
'Raises 22023 (with a HINT) unless `timezone` is a zone AT TIME ZONE accepts (case-insensitive IANA names, POSIX zones, abbreviations); NULL is refused.';

-- cron_validate: the gate create_task passes a schedule through, so bad input
-- is refused when it is stored, not when a worker first claims it. It may use
-- EXCEPTION blocks (it is not on the claim path) to turn PostgreSQL's own
-- errors for a bad zone or bad interval text into 22023 with a HINT.
CREATE OR REPLACE FUNCTION switchboard.cron_validate(schedule text, timezone text DEFAULT 'UTC')
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL UNSAFE
AS $fn$
DECLARE
    iv interval;
BEGIN
    PERFORM switchboard._check_timezone(timezone);
    IF schedule IS NULL THEN
        RETURN;                                 -- trigger-only task
    END IF;
    IF lower(left(ltrim(schedule, E' \t\n\r\f\013'), 6)) = '@every' THEN
        BEGIN
            iv := switchboard._every_interval(schedule);
        EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
            RAISE EXCEPTION 'invalid @every schedule "%": "%" is not an interval', schedule,
                    btrim(substr(btrim(schedule, E' \t\n\r\f\013'), 7), E' \t\n\r\f\013')
                USING ERRCODE = '22023',
                      HINT = 'Write e.g. "@every 30 seconds", "@every 5 minutes" or "@every 1 hour".';
        END;
        IF iv IS NOT NULL THEN
            RETURN;
        END IF;                                 -- "@everyday": _cron_parse calls it unknown
    END IF;
    PERFORM switchboard._cron_parse(schedule);
END
$fn$;

COMMENT ON FUNCTION switchboard.cron_validate(text, text) IS
'Raises 22023 (with a HINT) unless `schedule` is a valid cron expression, macro or @every '
'interval that can fire and `timezone` is a known zone. NULL schedule (trigger-only) is valid.';
REVOKE ALL ON FUNCTION switchboard.cron_validate(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.cron_validate(text, text) TO switchboard_app;

-- Helpers run with the caller's rights inside cron_next and cron_validate,
-- so the application role needs them too; PUBLIC does not.
REVOKE ALL ON FUNCTION switchboard._cron_field(text, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard._cron_field(text, integer, text) TO switchboard_app;
REVOKE ALL ON FUNCTION switchboard._cron_parse(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard._cron_parse(text) TO switchboard_app;
REVOKE ALL ON FUNCTION switchboard._every_interval(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard._every_interval(text) TO switchboard_app;
REVOKE ALL ON FUNCTION switchboard._check_timezone(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard._check_timezone(text) TO switchboard_app;

-- db/functions/20_scheduler.sql
-- Scheduler: tasks, runs, one-off jobs, leases and retries.
--
-- Every decision is one function call and one transaction. Exclusivity comes
-- from the partial unique indexes task_runs_one_active and
-- task_runs_queueing_lock (INSERT ... ON CONFLICT DO NOTHING), never from a
-- NOT EXISTS check, which is not race-free under READ COMMITTED. Workers are
-- woken by NOTIFY on channel switchboard_runs, which Postgres delivers at
-- COMMIT (and drops on ROLLBACK).

-- Next fire time of a task after `after`. @every keeps a fixed-rate anchor:
-- the next multiple of the interval after the previous due time, so a task
-- that was down for an hour fires once, on its grid, not 3,600 times.
CREATE OR REPLACE FUNCTION switchboard._task_next_fire(
    schedule text, timezone text, prev timestamptz, after timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_every interval := switchboard._every_interval(schedule);
    v_step double precision;
    v_n double precision;
BEGIN
    IF schedule IS NULL THEN
        RETURN NULL;
    END IF;
    IF v_every IS NULL THEN
        RETURN switchboard.cron_next(schedule, after, timezone);
    END IF;
    IF prev IS NULL OR prev > after THEN
        RETURN coalesce(prev, after + v_every);
    END IF;
    v_step := extract(epoch FROM v_every);
    v_n := floor(extract(epoch FROM (after - prev)) / v_step) + 1;
    RETURN prev + v_every * v_n;
END
$$;
REVOKE ALL ON FUNCTION switchboard._task_next_fire(text, text, timestamptz, timestamptz) FROM PUBLIC;

-- _check_timezone lives in 10_cron.sql: the zone rule is cron_validate's.

CREATE OR REPLACE FUNCTION switchboard._check_handler(handler text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF handler IS NULL OR handler !~ '^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$' THEN
        RAISE EXCEPTION 'invalid handler name "%"', handler
            USING ERRCODE = '22023',
                  HINT = 'A handler is a name like sql, notify, maintenance or myapp.send_mail (letters, digits, _ . : -).';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_handler(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard._check_lease(lease interval)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF lease IS NULL OR lease <= interval '0' OR lease > interval '1 day' THEN
        RAISE EXCEPTION 'invalid lease "%"', lease
            USING ERRCODE = '22023', HINT = 'A lease is a positive interval of at most 1 day, e.g. ''60 seconds''.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_lease(interval) FROM PUBLIC;

-- No SET clause, so the planner inlines it into the caller (see _random_128 in
-- 30_tickets.sql: a SQL function that is not inlined is planned again in every
-- transaction); the body is schema-qualified instead.
CREATE OR REPLACE FUNCTION switchboard._wake_workers()
RETURNS void
LANGUAGE sql
AS $$ SELECT pg_catalog.pg_notify('switchboard_runs', '') $$;
REVOKE ALL ON FUNCTION switchboard._wake_workers() FROM PUBLIC;

-- Delay before retry N+1 of a failed run: 2^attempt seconds, capped at 1 hour.
CREATE OR REPLACE FUNCTION switchboard._retry_backoff(attempt integer)
RETURNS interval
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT least(interval '1 second' * power(2, least(attempt, 12)), interval '1 hour') $$;
REVOKE ALL ON FUNCTION switchboard._retry_backoff(integer) FROM PUBLIC;
COMMENT ON FUNCTION switchboard._retry_backoff(integer) IS
    'Backoff before retrying a failed run: 2^attempt seconds, capped at 1 hour.';

-- create_task: validates everything up front so a bad schedule or zone never
-- reaches a claim. The first fire of @every is one interval from now.
CREATE OR REPLACE FUNCTION switchboard.create_task(
    name text, schedule text, handler text, args jsonb DEFAULT '{}',
    timezone text DEFAULT 'UTC', max_attempts integer DEFAULT 3)
RETURNS switchboard.tasks
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_task switchboard.tasks;
BEGIN
    IF name IS NULL OR length(btrim(name)) = 0 OR length(name) > 200 THEN
        RAISE EXCEPTION 'invalid task name "%"', name
            USING ERRCODE = '22023', HINT = 'A task name is 1 to 200 characters.';
    END IF;
    PERFORM switchboard._check_handler(handler);
    PERFORM switchboard._check_timezone(timezone);
    IF args IS NULL OR jsonb_typeof(args) <> 'object' THEN
        RAISE EXCEPTION 'task args must be a JSON object, got %', coalesce(jsonb_typeof(args), 'NULL')
            USING ERRCODE = '22023', HINT = 'Pass args as ''{"key": "value"}''::jsonb.';
    END IF;
    IF max_attempts IS NULL OR max_attempts NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'invalid max_attempts %', max_attempts
            USING ERRCODE = '22023', HINT = 'max_attempts is between 1 and 100.';
    END IF;
    IF schedule IS NOT NULL THEN
        PERFORM switchboard.cron_validate(schedule, timezone);
    END IF;
    BEGIN
        INSERT INTO switchboard.tasks AS t (name, schedule, timezone, handler, args, max_attempts, next_run_at, created_by)
        VALUES (name, schedule, timezone, handler, args, max_attempts,
                switchboard._task_next_fire(schedule, timezone, NULL, now()), session_user)
        RETURNING * INTO v_task;
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'task "%" already exists', name
            USING ERRCODE = '23505', HINT = 'Task names are unique; use update_task() to change it.';
    END;
    RETURN v_task;
END
$$;
COMMENT ON FUNCTION switchboard.create_task(text, text, text, jsonb, text, integer) IS
    'Create a task. schedule: 5-field cron, @hourly/@daily/@weekly/@monthly/@yearly, "@every <interval>", or NULL (trigger-only). Raises 22023 on a bad schedule, zone, handler or args; 23505 if the name exists.';
REVOKE ALL ON FUNCTION switchboard.create_task(text, text, text, jsonb, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.create_task(text, text, text, jsonb, text, integer) TO switchboard_app;

-- update_task: a PATCH. Only the keys present change; next_run_at is
-- recomputed from now() when the schedule, zone or is_active changes.
CREATE OR REPLACE FUNCTION switchboard.update_task(task_id uuid, changes jsonb)
RETURNS switchboard.tasks
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_task switchboard.tasks;
    v_key text;
    v_resched boolean := false;
BEGIN
    IF changes IS NULL OR jsonb_typeof(changes) <> 'object' THEN
        RAISE EXCEPTION 'changes must be a JSON object' USING ERRCODE = '22023',
            HINT = 'e.g. ''{"is_active": false}''::jsonb';
    END IF;
    FOR v_key IN SELECT jsonb_object_keys(changes) LOOP
        IF v_key NOT IN ('name', 'schedule', 'timezone', 'handler', 'args', 'is_active', 'max_attempts') THEN
            RAISE EXCEPTION 'unknown task field "%"', v_key USING ERRCODE = '22023',
                HINT = 'Changeable fields: name, schedule, timezone, handler, args, is_active, max_attempts.';
        END IF;
    END LOOP;
    SELECT * INTO v_task FROM switchboard.tasks t WHERE t.id = task_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task % does not exist', task_id USING ERRCODE = 'P0002';
    END IF;
    IF changes ? 'name' THEN
        IF jsonb_typeof(changes->'name') <> 'string' OR length(btrim(changes->>'name')) = 0
           OR length(changes->>'name') > 200 THEN
            RAISE EXCEPTION 'invalid task name %', changes->'name' USING ERRCODE = '22023',
                HINT = 'A task name is 1 to 200 characters.';
        END IF;
        v_task.name := changes->>'name';
    END IF;
    IF changes ? 'schedule' THEN
        IF jsonb_typeof(changes->'schedule') NOT IN ('string', 'null') THEN
            RAISE EXCEPTION 'invalid schedule %', changes->'schedule' USING ERRCODE = '22023';
        END IF;
        v_task.schedule := changes->>'schedule';
        v_resched := true;
    END IF;
    IF changes ? 'timezone' THEN
        v_task.timezone := changes->>'timezone';
        PERFORM switchboard._check_timezone(v_task.timezone);
        v_resched := true;
    END IF;
    IF changes ? 'handler' THEN
        v_task.handler := changes->>'handler';
        PERFORM switchboard._check_handler(v_task.handler);
    END IF;
    IF changes ? 'args' THEN
        IF jsonb_typeof(changes->'args') <> 'object' THEN
            RAISE EXCEPTION 'task args must be a JSON object, got %', jsonb_typeof(changes->'args')
                USING ERRCODE = '22023';
        END IF;
        v_task.args := changes->'args';
    END IF;
    IF changes ? 'is_active' THEN
        IF jsonb_typeof(changes->'is_active') <> 'boolean' THEN
            RAISE EXCEPTION 'is_active must be true or false, got %', changes->'is_active' USING ERRCODE = '22023';
        END IF;
        v_resched := v_resched OR (v_task.is_active IS DISTINCT FROM (changes->>'is_active')::boolean);
        v_task.is_active := (changes->>'is_active')::boolean;
    END IF;
    IF changes ? 'max_attempts' THEN
        IF jsonb_typeof(changes->'max_attempts') <> 'number'
           OR (changes->>'max_attempts')::numeric NOT BETWEEN 1 AND 100
           OR (changes->>'max_attempts')::numeric % 1 <> 0 THEN
            RAISE EXCEPTION 'invalid max_attempts %', changes->'max_attempts' USING ERRCODE = '22023',
                HINT = 'max_attempts is between 1 and 100.';
        END IF;
        v_task.max_attempts := (changes->>'max_attempts')::integer;
    END IF;
    IF v_task.schedule IS NOT NULL THEN
        PERFORM switchboard.cron_validate(v_task.schedule, v_task.timezone);
    END IF;
    IF v_resched THEN
        v_task.next_run_at := switchboard._task_next_fire(v_task.schedule, v_task.timezone, NULL, now());
    END IF;
    BEGIN
        UPDATE switchboard.tasks t
           SET name = v_task.name, schedule = v_task.schedule, timezone = v_task.timezone,
               handler = v_task.handler, args = v_task.args, is_active = v_task.is_active,
               max_attempts = v_task.max_attempts, next_run_at = v_task.next_run_at, updated_at = now(),
               last_error = CASE WHEN v_resched THEN NULL ELSE t.last_error END,
               last_error_at = CASE WHEN v_resched THEN NULL ELSE t.last_error_at END
         WHERE t.id = task_id
        RETURNING * INTO v_task;
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'task "%" already exists', v_task.name USING ERRCODE = '23505';
    END;
    RETURN v_task;
END
$$;
COMMENT ON FUNCTION switchboard.update_task(uuid, jsonb) IS
    'Change a task: pass only the fields to change, e.g. ''{"is_active": false}'' pauses it. Raises P0002 if the task does not exist, 22023 on bad values.';
REVOKE ALL ON FUNCTION switchboard.update_task(uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.update_task(uuid, jsonb) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.delete_task(task_id uuid)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM switchboard.tasks t WHERE t.id = task_id;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION switchboard.delete_task(uuid) IS
    'Delete a task and its run history. Returns false if there was no such task.';
REVOKE ALL ON FUNCTION switchboard.delete_task(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.delete_task(uuid) TO switchboard_app;

-- One retry rule for both ways a run can fail (lease expired, handler
-- failed): while attempts remain, a new queued run with attempt + 1 replaces
-- it, not before run_at. Returns whether a retry was queued.
CREATE OR REPLACE FUNCTION switchboard._queue_retry(run switchboard.task_runs, run_at timestamptz)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF run.attempt >= run.max_attempts THEN
        RETURN false;
    END IF;
    INSERT INTO switchboard.task_runs
        (task_id, handler, args, status, trigger, attempt, max_attempts, queueing_lock,
         run_at, scheduled_for, retry_of)
    VALUES (run.task_id, run.handler, run.args, 'queued', 'retry', run.attempt + 1,
            run.max_attempts, run.queueing_lock, _queue_retry.run_at, run.scheduled_for, run.id)
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;
REVOKE ALL ON FUNCTION switchboard._queue_retry(switchboard.task_runs, timestamptz) FROM PUBLIC;

-- Expired leases -> abandoned (terminal) + a queued retry while attempts
-- remain. SKIP LOCKED so concurrent rescuers never block each other or a
-- worker that is finishing the same run right now.
CREATE OR REPLACE FUNCTION switchboard._rescue_expired_runs(max_rows integer)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_run switchboard.task_runs;
    v_count integer := 0;
    v_retried integer := 0;
BEGIN
    FOR v_run IN
        UPDATE switchboard.task_runs r
           SET status = 'abandoned', finished_at = now(),
               error = 'lease expired: worker ' || coalesce(r.worker, '?') || ' stopped heartbeating'
         WHERE r.id IN (SELECT e.id FROM switchboard.task_runs e
                         WHERE e.status = 'running' AND e.lease_expires_at < now()
                         ORDER BY e.lease_expires_at LIMIT max_rows
                         FOR UPDATE SKIP LOCKED)
        RETURNING r.*
    LOOP
        v_count := v_count + 1;
        IF switchboard._queue_retry(v_run, now()) THEN
            v_retried := v_retried + 1;
        END IF;
    END LOOP;
    IF v_retried > 0 THEN
        PERFORM switchboard._wake_workers();
    END IF;
    RETURN v_count;
END
$$;
REVOKE ALL ON FUNCTION switchboard._rescue_expired_runs(integer) FROM PUBLIC;

-- _claim_tick: the tick half of claim_due_task. Takes the oldest due task
-- (FOR UPDATE SKIP LOCKED), advances its next_run_at and creates its running
-- run in the same transaction: a crash after COMMIT leaves both, a crash
-- before leaves neither. Outcomes:
--   run set                   the tick was claimed;
--   run NULL, skipped true    a due task was handled without a run: it still
--                             had an active run (the tick is counted in
--                             skipped_ticks, never run concurrently), or its
--                             next fire time could not be computed (parked,
--                             see below), or it was a parked task that is
--                             healthy again; more may be due, look again;
--   run NULL, skipped false   nothing due that another worker has not locked.
-- One bad row cannot stop the scheduler: an error while computing the next
-- fire time (a zone typed by hand, a schedule that never fires, an anchor at
-- -infinity) is caught here, in a subtransaction entered only on the tick
-- path, and the task is parked: no run, next_run_at = now + 1 minute,
-- last_error set. When a parked task comes due again it is re-checked: still
-- broken, it stays parked; fixed (even by a plain UPDATE), it goes back on its
-- schedule from now without a run at the re-check instant.
CREATE OR REPLACE FUNCTION switchboard._claim_tick(
    worker text, lease interval, claim_at timestamptz,
    OUT run switchboard.task_runs, OUT skipped boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_task switchboard.tasks;
    v_due timestamptz;
    v_next timestamptz;
    v_err text;
    v_state text;
BEGIN
    skipped := false;
    SELECT * INTO v_task FROM switchboard.tasks t
     WHERE t.is_active AND t.next_run_at <= _claim_tick.claim_at
       AND t.handler <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
     ORDER BY t.next_run_at LIMIT 1 FOR UPDATE OF t SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    skipped := true;
    -- A due time before 1970 (-infinity, a BC date) is a hand-made "run now":
    -- the tick is due now, and no client has to read a timestamp it cannot
    -- represent (psycopg refuses dates before year 1).
    v_due := CASE WHEN v_task.next_run_at >= timestamptz '1970-01-01 00:00:00+00'
                  THEN v_task.next_run_at ELSE _claim_tick.claim_at END;
    BEGIN
        -- A parked task is re-anchored from now (prev NULL), like update_task does.
        v_next := switchboard._task_next_fire(
            v_task.schedule, v_task.timezone,
            CASE WHEN v_task.last_error IS NULL THEN v_due END, _claim_tick.claim_at);
    EXCEPTION WHEN OTHERS THEN  -- not query_canceled: a cancel still cancels
        GET STACKED DIAGNOSTICS v_err = MESSAGE_TEXT, v_state = RETURNED_SQLSTATE;
        UPDATE switchboard.tasks
           SET next_run_at = _claim_tick.claim_at + interval '1 minute',
               last_error = left(format('next fire time of schedule %L in zone %L: %s (SQLSTATE %s)',
                                        v_task.schedule, v_task.timezone, v_err, v_state), 2000),
               last_error_at = now()
         WHERE id = v_task.id;
        RETURN;
    END;
    IF v_task.last_error IS NOT NULL THEN
        UPDATE switchboard.tasks SET next_run_at = v_next, last_error = NULL, last_error_at = NULL
         WHERE id = v_task.id;
        RETURN;
    END IF;
    UPDATE switchboard.tasks SET next_run_at = v_next WHERE id = v_task.id;
    INSERT INTO switchboard.task_runs
        (task_id, handler, args, status, trigger, attempt, max_attempts,
         run_at, scheduled_for, worker, lease_expires_at, started_at)
    VALUES (v_task.id, v_task.handler, v_task.args, 'running', 'schedule', 1,
            v_task.max_attempts, v_due, v_due,
            _claim_tick.worker, _claim_tick.claim_at + _claim_tick.lease, _claim_tick.claim_at)
    ON CONFLICT (task_id) WHERE status IN ('queued', 'running') AND task_id IS NOT NULL DO NOTHING
    RETURNING * INTO run;
    IF FOUND THEN
        skipped := false;
        RETURN;
    END IF;
    -- The task still has an active run: skip this tick, never overlap.
    UPDATE switchboard.tasks SET skipped_ticks = skipped_ticks + 1 WHERE id = v_task.id;
END
$$;
REVOKE ALL ON FUNCTION switchboard._claim_tick(text, interval, timestamptz) FROM PUBLIC;

-- How many tasks are parked (see _claim_tick), for status(). PL/pgSQL so that
-- its body is not resolved when it is created: the function files are applied
-- at HEAD even when pgmigrate targets an older version (-t 1), whose schema
-- has no last_error column; a LANGUAGE sql status() naming it would fail there.
CREATE OR REPLACE FUNCTION switchboard._tasks_broken()
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT count(*) FROM switchboard.tasks WHERE last_error IS NOT NULL);
END
$$;
REVOKE ALL ON FUNCTION switchboard._tasks_broken() FROM PUBLIC;

-- claim_due_task: one unit of work per call, oldest due first across queued
-- runs and due ticks (a backlog of jobs cannot starve cron ticks, and vice
-- versa). Rows are taken with FOR UPDATE SKIP LOCKED, so N workers never
-- block on or double-claim the same row. Expired leases are rescued here
-- first, so a stuck maintenance run cannot block its own rescue. Each round:
--   1. the due tick, if it is the oldest due work (_claim_tick);
--   2. the queue head (the hot path: one UPDATE, no helper call);
--   3. the due tick, if the queue head was older but locked by others.
-- A paused handler's queued runs and due ticks are passed over: "handler <>
-- ALL (ARRAY(SELECT ... FROM paused_handlers))" is an InitPlan, read once per
-- statement, and a plain filter on the index scan that keeps the claim's
-- ordered, LIMITed walk. (A NOT EXISTS anti-join here made the generic plan a
-- hash anti-join over every due queued row plus a sort: 1.5 -> 86 ms per
-- claim with 50,000 queued runs.) A tick passed over keeps
-- its next_run_at, so when the handler is resumed the task catches up by its
-- own rule: once, not once per missed tick; @every keeps its anchor.
-- A round that only skipped ticks looks again, since more may be due; a
-- round that found everything locked by other workers stops. The bound (32
-- rounds) only matters when that many ticks are skipped or parked at once:
-- the call then returns no row and the next one carries on.
CREATE OR REPLACE FUNCTION switchboard.claim_due_task(worker text, lease interval DEFAULT '60 seconds')
RETURNS SETOF switchboard.task_runs
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := now();
    v_worker text := claim_due_task.worker;
    v_lease interval := claim_due_task.lease;
    v_run switchboard.task_runs;
    v_tick record;
    v_queued_at timestamptz;
    v_task_at timestamptz;
    v_tick_first boolean;
    v_skipped boolean;
    v_expired boolean;
BEGIN
    IF v_worker IS NULL OR length(v_worker) = 0 OR length(v_worker) > 200 THEN
        RAISE EXCEPTION 'invalid worker name "%"', v_worker USING ERRCODE = '22023',
            HINT = 'Worker names are unique per process, e.g. host:pid:random.';
    END IF;
    IF v_lease IS NULL OR v_lease <= interval '0' OR v_lease > interval '1 day' THEN
        PERFORM switchboard._check_lease(v_lease);  -- raises (the test is inlined: hot path)
    END IF;

    -- One statement answers both: is a lease to rescue, is a tick due?
    SELECT EXISTS (SELECT 1 FROM switchboard.task_runs
                    WHERE status = 'running' AND lease_expires_at < v_now),
           (SELECT t.next_run_at FROM switchboard.tasks t
             WHERE t.is_active AND t.next_run_at <= v_now
               AND t.handler <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
             ORDER BY t.next_run_at LIMIT 1)
      INTO v_expired, v_task_at;
    IF v_expired THEN
        PERFORM switchboard._rescue_expired_runs(100);
    END IF;

    FOR v_round IN 1..32 LOOP
        IF v_round > 1 THEN
            SELECT t.next_run_at INTO v_task_at FROM switchboard.tasks t
             WHERE t.is_active AND t.next_run_at <= v_now
               AND t.handler <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
             ORDER BY t.next_run_at LIMIT 1;
        END IF;
        -- The queue's head is only worth a look of its own when a tick competes
        -- with it; otherwise the claim in step 2 is the only scan of the head.
        v_queued_at := NULL;
        IF v_task_at IS NOT NULL THEN
            SELECT q.run_at INTO v_queued_at FROM switchboard.task_runs q
             WHERE q.status = 'queued' AND q.run_at <= v_now
               AND q.handler <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
             ORDER BY q.run_at, q.id LIMIT 1;
        END IF;
        v_tick_first := v_task_at IS NOT NULL AND (v_queued_at IS NULL OR v_task_at <= v_queued_at);
        v_skipped := false;

        -- 1. the due tick, when it is the oldest due work
        IF v_tick_first THEN
            SELECT t.run, t.skipped INTO v_tick FROM switchboard._claim_tick(v_worker, v_lease, v_now) t;
            IF (v_tick.run).id IS NOT NULL THEN
                RETURN NEXT v_tick.run;
                RETURN;
            END IF;
            v_skipped := v_tick.skipped;
        END IF;

        -- 2. the queue head
        IF v_queued_at IS NOT NULL OR v_task_at IS NULL THEN
            UPDATE switchboard.task_runs
               SET status = 'running', worker = v_worker, lease_expires_at = v_now + v_lease,
                   started_at = v_now
             WHERE id = (SELECT q.id FROM switchboard.task_runs q
                          WHERE q.status = 'queued' AND q.run_at <= v_now
                            AND q.handler <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
                          ORDER BY q.run_at, q.id LIMIT 1 FOR UPDATE OF q SKIP LOCKED)
            RETURNING * INTO v_run;
            IF FOUND THEN
                RETURN NEXT v_run;
                RETURN;
            END IF;
        END IF;

        -- 3. the due tick, when an older queued run was there but taken by others
        IF v_task_at IS NOT NULL AND NOT v_tick_first THEN
            SELECT t.run, t.skipped INTO v_tick FROM switchboard._claim_tick(v_worker, v_lease, v_now) t;
            IF (v_tick.run).id IS NOT NULL THEN
                RETURN NEXT v_tick.run;
                RETURN;
            END IF;
            v_skipped := v_tick.skipped;
        END IF;

        -- Nothing claimed. Look again only if a tick was skipped (more may be due);
        -- otherwise everything due is locked by other workers.
        EXIT WHEN NOT v_skipped;
    END LOOP;
    RETURN;
END
$$;
COMMENT ON FUNCTION switchboard.claim_due_task(text, interval) IS
    'Claim at most one unit of work (a queued run or a due task tick, oldest due first) for worker, leased until now() + lease. FOR UPDATE SKIP LOCKED: concurrent workers never get the same run. A task whose next fire time cannot be computed is skipped and marked (tasks.last_error, status() tasks_broken). Work of a paused handler (pause_handler()) is skipped. Returns no row when nothing is due.';
REVOKE ALL ON FUNCTION switchboard.claim_due_task(text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.claim_due_task(text, interval) TO switchboard_app;

-- create_run_exclusive: the unique partial index task_runs_one_active decides.
-- A concurrent INSERT waits for the other transaction and then does nothing.
CREATE OR REPLACE FUNCTION switchboard.create_run_exclusive(task_id uuid, trigger text DEFAULT 'manual')
RETURNS SETOF switchboard.task_runs
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_id uuid := create_run_exclusive.task_id;
    v_trigger text := coalesce(create_run_exclusive.trigger, 'manual');
    v_run switchboard.task_runs;
BEGIN
    IF v_trigger !~ '^[A-Za-z0-9_.:-]{1,64}$' THEN
        RAISE EXCEPTION 'invalid trigger "%"', v_trigger USING ERRCODE = '22023',
            HINT = 'A trigger is a short label such as manual or api.';
    END IF;
    INSERT INTO switchboard.task_runs (task_id, handler, args, status, trigger, max_attempts, run_at)
    SELECT t.id, t.handler, t.args, 'queued', v_trigger, t.max_attempts, now()
      FROM switchboard.tasks t WHERE t.id = v_id
    ON CONFLICT (task_id) WHERE status IN ('queued', 'running') AND task_id IS NOT NULL DO NOTHING
    RETURNING * INTO v_run;
    IF FOUND THEN
        PERFORM switchboard._wake_workers();
        RETURN NEXT v_run;
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM switchboard.tasks t WHERE t.id = v_id) THEN
        RAISE EXCEPTION 'task % does not exist', v_id USING ERRCODE = 'P0002',
            HINT = 'See SELECT id, name FROM switchboard.tasks;';
    END IF;
    RETURN;
END
$$;
COMMENT ON FUNCTION switchboard.create_run_exclusive(uuid, text) IS
    'Queue a run of a task iff it has no queued or running run (enforced by a unique partial index); returns the run, or no row if one is already active. Workers are woken at COMMIT. P0002 if the task does not exist.';
REVOKE ALL ON FUNCTION switchboard.create_run_exclusive(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.create_run_exclusive(uuid, text) TO switchboard_app;

-- enqueue: transactional. The job is a row in the caller's transaction, so it
-- exists iff that transaction commits; the wake-up NOTIFY is sent at COMMIT.
CREATE OR REPLACE FUNCTION switchboard.enqueue(
    handler text, args jsonb DEFAULT '{}', run_at timestamptz DEFAULT now(),
    queueing_lock text DEFAULT NULL, max_attempts integer DEFAULT 3)
RETURNS SETOF switchboard.task_runs
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_run switchboard.task_runs;
BEGIN
    PERFORM switchboard._check_handler(enqueue.handler);
    IF enqueue.args IS NULL OR jsonb_typeof(enqueue.args) <> 'object' THEN
        RAISE EXCEPTION 'job args must be a JSON object, got %', coalesce(jsonb_typeof(enqueue.args), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF enqueue.max_attempts IS NULL OR enqueue.max_attempts NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'invalid max_attempts %', enqueue.max_attempts
            USING ERRCODE = '22023', HINT = 'max_attempts is between 1 and 100.';
    END IF;
    IF enqueue.queueing_lock IS NOT NULL AND length(enqueue.queueing_lock) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'invalid queueing_lock "%"', enqueue.queueing_lock USING ERRCODE = '22023';
    END IF;
    INSERT INTO switchboard.task_runs (task_id, handler, args, status, trigger, max_attempts, queueing_lock, run_at)
    VALUES (NULL, enqueue.handler, enqueue.args, 'queued', 'enqueue', enqueue.max_attempts,
            enqueue.queueing_lock, coalesce(enqueue.run_at, now()))
    ON CONFLICT (queueing_lock) WHERE status IN ('queued', 'running') AND queueing_lock IS NOT NULL
    DO NOTHING
    RETURNING * INTO v_run;
    IF FOUND THEN
        PERFORM switchboard._wake_workers();
        RETURN NEXT v_run;
    END IF;
    RETURN;
END
$$;
COMMENT ON FUNCTION switchboard.enqueue(text, jsonb, timestamptz, text, integer) IS
    'Enqueue a one-off job in the caller''s transaction (it exists iff the transaction commits; workers are woken at COMMIT), not due before run_at. With a queueing_lock, at most one queued-or-running job holds it: a second enqueue returns no row.';
REVOKE ALL ON FUNCTION switchboard.enqueue(text, jsonb, timestamptz, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.enqueue(text, jsonb, timestamptz, text, integer) TO switchboard_app;

-- heartbeat_run / finish_run / release_run are fenced on (run, worker,
-- running): a worker whose lease expired and whose run was rescued cannot
-- touch the rescued run.
CREATE OR REPLACE FUNCTION switchboard.heartbeat_run(run_id bigint, worker text, lease interval DEFAULT '60 seconds')
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM switchboard._check_lease(heartbeat_run.lease);
    UPDATE switchboard.task_runs SET lease_expires_at = now() + heartbeat_run.lease
     WHERE id = heartbeat_run.run_id AND worker = heartbeat_run.worker AND status = 'running';
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION switchboard.heartbeat_run(bigint, text, interval) IS
    'Extend the lease of a running run to now() + lease. False (and nothing changed) if worker no longer owns the run.';
REVOKE ALL ON FUNCTION switchboard.heartbeat_run(bigint, text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.heartbeat_run(bigint, text, interval) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.finish_run(
    run_id bigint, worker text, ok boolean, result jsonb DEFAULT NULL, error text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_run switchboard.task_runs;
BEGIN
    IF finish_run.ok IS NULL THEN
        RAISE EXCEPTION 'ok must be true or false' USING ERRCODE = '22023';
    END IF;
    UPDATE switchboard.task_runs
       SET status = CASE WHEN finish_run.ok THEN 'succeeded' ELSE 'failed' END,
           finished_at = now(), lease_expires_at = NULL,
           result = finish_run.result, error = left(finish_run.error, 10000)
     WHERE id = finish_run.run_id AND worker = finish_run.worker AND status = 'running'
    RETURNING * INTO v_run;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF NOT finish_run.ok
       AND switchboard._queue_retry(v_run, now() + switchboard._retry_backoff(v_run.attempt)) THEN
        PERFORM switchboard._wake_workers();
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION switchboard.finish_run(bigint, text, boolean, jsonb, text) IS
    'Record a run''s outcome. A failed run with attempts left is retried as a new queued run after 2^attempt seconds. False (and nothing changed) if worker no longer owns the run.';
REVOKE ALL ON FUNCTION switchboard.finish_run(bigint, text, boolean, jsonb, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.finish_run(bigint, text, boolean, jsonb, text) TO switchboard_app;

-- release_run: graceful hand-back on shutdown. The run goes back to queued
-- (same attempt) and workers are woken, so another replica takes it at once
-- instead of waiting for the lease to expire.
CREATE OR REPLACE FUNCTION switchboard.release_run(run_id bigint, worker text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    UPDATE switchboard.task_runs
       SET status = 'queued', worker = NULL, lease_expires_at = NULL, started_at = NULL, run_at = now()
     WHERE id = release_run.run_id AND worker = release_run.worker AND status = 'running';
    IF FOUND THEN
        PERFORM switchboard._wake_workers();
        RETURN true;
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION switchboard.release_run(bigint, text) IS
    'Hand a running run back (shutdown): it becomes queued again, same attempt, and another worker can claim it at once. False if worker no longer owns it.';
REVOKE ALL ON FUNCTION switchboard.release_run(bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.release_run(bigint, text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.reap_expired_runs()
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_total integer := 0;
    v_n integer;
BEGIN
    LOOP
        v_n := switchboard._rescue_expired_runs(1000);
        v_total := v_total + v_n;
        EXIT WHEN v_n < 1000;
    END LOOP;
    RETURN v_total;
END
$$;
COMMENT ON FUNCTION switchboard.reap_expired_runs() IS
    'Mark running runs whose lease expired as abandoned; while attempts remain, queue a new run with attempt + 1. Returns how many were abandoned.';
REVOKE ALL ON FUNCTION switchboard.reap_expired_runs() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_expired_runs() TO switchboard_app;

-- cancel_run, retry_run, pause_handler / resume_handler: db/functions/27_operate.sql.

-- reap_runs: bounded since V0013. One DELETE of every old run was one
-- transaction of any size: a week of history at 1,000 jobs/s is 600 million
-- rows, and even 1,000,000 rows is seconds of I/O and WAL, a snapshot that
-- holds back every vacuum of the database (the claim's queue index fills
-- with dead entries meanwhile) and a lock on every row. Now one call deletes
-- at most max_rows, oldest finished first (the task_runs_finished index),
-- and returns how many; a caller that gets max_rows back calls again in a new
-- transaction (the maintenance handler does, within its time budget).
CREATE OR REPLACE FUNCTION switchboard.reap_runs(keep interval, max_rows integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    IF keep IS NULL OR keep < interval '0' THEN
        RAISE EXCEPTION 'invalid keep interval "%"', keep USING ERRCODE = '22023',
            HINT = 'keep is a non-negative interval such as ''7 days''.';
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023',
            HINT = 'max_rows bounds one call (one transaction): 1 to 1000000; 10000 is the default batch.';
    END IF;
    -- ctid, not id: the rows found are deleted without a second index probe.
    -- SKIP LOCKED: a run that someone is touching right now waits for the next call.
    DELETE FROM switchboard.task_runs r
     WHERE r.ctid = ANY (ARRAY(SELECT o.ctid FROM switchboard.task_runs o
                                WHERE o.status IN ('succeeded', 'failed', 'abandoned', 'cancelled')
                                  AND o.finished_at < now() - keep
                                ORDER BY o.finished_at
                                LIMIT max_rows FOR UPDATE SKIP LOCKED))
       AND r.status IN ('succeeded', 'failed', 'abandoned', 'cancelled') AND r.finished_at < now() - keep;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_runs(interval, integer) IS
    'Delete at most max_rows finished runs (succeeded, failed, abandoned, cancelled) older than keep, oldest first, in the caller''s transaction. Returns how many; max_rows back means more are due (call again, in a new transaction).';
REVOKE ALL ON FUNCTION switchboard.reap_runs(interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_runs(interval, integer) TO switchboard_app;

-- The previous release's entry point, now one batch of 10,000 (the
-- documented batch size): its callers already loop on the count or run it
-- every maintenance tick.
CREATE OR REPLACE FUNCTION switchboard.reap_runs(keep interval DEFAULT '7 days')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN switchboard.reap_runs(keep, 10000);
END
$$;
COMMENT ON FUNCTION switchboard.reap_runs(interval) IS
    'Delete finished runs (succeeded, failed, abandoned, cancelled) older than keep, at most 10000 per call (one batch; see reap_runs(interval, integer)). Returns how many were deleted.';
REVOKE ALL ON FUNCTION switchboard.reap_runs(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_runs(interval) TO switchboard_app;

-- db/functions/25_batch_claim.sql
-- Batched claim and finish: what a replica with k free slots asks for in one
-- round trip, and how it records k successes in one.
--
-- End to end, a job costs two round trips (claim, finish) and the server
-- CPU of two function calls; with short handlers that, not scheduling, is the
-- limit (py-spy: 46% of a replica's time in the claim round trip, 30% in the
-- finish). claim_due_tasks() takes the first unit through claim_due_task()
-- (oldest due first across ticks and queued runs, lease rescue, tick
-- skipping), then fills the remaining slots with further queued runs in one
-- UPDATE over FOR UPDATE SKIP LOCKED, so concurrent replicas still never get
-- the same run. finish_runs() records successes only; a failure goes through
-- finish_run(), which schedules its retry. Both stay fenced on
-- (run, worker, running).
CREATE OR REPLACE FUNCTION switchboard.claim_due_tasks(
    worker text, lease interval DEFAULT '60 seconds', max_runs integer DEFAULT 1)
RETURNS SETOF switchboard.task_runs
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_first switchboard.task_runs;
    v_now timestamptz := now();
BEGIN
    IF max_runs IS NULL OR max_runs < 1 OR max_runs > 1000 THEN
        RAISE EXCEPTION 'invalid max_runs %', max_runs USING ERRCODE = '22023',
            HINT = 'max_runs is how many free slots the worker has: 1 to 1000.';
    END IF;
    SELECT * INTO v_first FROM switchboard.claim_due_task(claim_due_tasks.worker, claim_due_tasks.lease);
    IF NOT FOUND OR v_first.id IS NULL THEN
        RETURN;
    END IF;
    RETURN NEXT v_first;
    IF max_runs > 1 THEN
        RETURN QUERY
        UPDATE switchboard.task_runs r
           SET status = 'running', worker = claim_due_tasks.worker,
               lease_expires_at = v_now + claim_due_tasks.lease, started_at = v_now
         WHERE r.id = ANY (ARRAY(SELECT q.id FROM switchboard.task_runs q
                                  WHERE q.status = 'queued' AND q.run_at <= v_now
                                    AND q.handler <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
                                  ORDER BY q.run_at, q.id
                                  LIMIT max_runs - 1 FOR UPDATE OF q SKIP LOCKED))
        RETURNING r.*;
    END IF;
END
$$;
COMMENT ON FUNCTION switchboard.claim_due_tasks(text, interval, integer) IS
    'Claim up to max_runs units of work in one call: the first exactly as claim_due_task() (oldest due first, ticks included), the rest from the queued runs (FOR UPDATE SKIP LOCKED). Paused handlers (pause_handler()) are skipped. No row when nothing is due.';
REVOKE ALL ON FUNCTION switchboard.claim_due_tasks(text, interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.claim_due_tasks(text, interval, integer) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.finish_runs(worker text, run_ids bigint[], results jsonb[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF run_ids IS NULL OR (results IS NOT NULL AND cardinality(results) <> cardinality(run_ids)) THEN
        RAISE EXCEPTION 'run_ids and results differ in length' USING ERRCODE = '22023',
            HINT = 'Pass one result per run id, or NULL for none.';
    END IF;
    RETURN QUERY
    UPDATE switchboard.task_runs r
       SET status = 'succeeded', finished_at = now(), lease_expires_at = NULL, result = x.res
      FROM unnest(run_ids, coalesce(results, array_fill(NULL::jsonb, ARRAY[cardinality(run_ids)]))) AS x(id, res)
     WHERE r.id = x.id AND r.worker = finish_runs.worker AND r.status = 'running'
    RETURNING r.id;
END
$$;
COMMENT ON FUNCTION switchboard.finish_runs(text, bigint[], jsonb[]) IS
    'Record several successful runs of worker at once (results in the same order, or NULL). Returns the ids actually finished: a run the worker no longer owns is left untouched (fencing). Failures go through finish_run(), which schedules retries.';
REVOKE ALL ON FUNCTION switchboard.finish_runs(text, bigint[], jsonb[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.finish_runs(text, bigint[], jsonb[]) TO switchboard_app;

-- db/functions/27_operate.sql
-- Operate: cancel, retry and pause work; the runs view and its listing.
--
-- Every decision is still one statement on task_runs, fenced or made
-- exclusive by what already guards the scheduler:
--   * cancel_run and finish_run both UPDATE ... WHERE status = 'running'
--     (or 'queued'); the row lock orders them, and the loser re-reads the row,
--     finds it final and changes nothing. A worker whose run was cancelled
--     learns it from lost_runs() (asked when the relay hears switchboard_runs,
--     which cancel_run sends at commit) or, at the latest, from its next
--     heartbeat_run(), which answers false.
--   * retry_run inserts with ON CONFLICT DO NOTHING: the unique partial
--     indexes task_runs_one_active (a task runs once at a time),
--     task_runs_queueing_lock and task_runs_one_active_retry (a run has one
--     active retry) decide, never a NOT EXISTS check.
--   * pause_handler is a row in switchboard.paused_handlers; the claim
--     functions skip the work of a paused handler (20_scheduler.sql).

-- The runs as an operator reads them: the task's name beside each run, and
-- how long it took (or, while running, has taken so far).
CREATE OR REPLACE VIEW switchboard.runs AS
    SELECT r.id, r.task_id, t.name AS task_name, r.handler, r.status, r.trigger,
           r.attempt, r.max_attempts, r.worker,
           r.created_at, r.run_at, r.started_at, r.finished_at,
           coalesce(r.finished_at, CASE WHEN r.status = 'running' THEN now() END) - r.started_at AS duration,
           (extract(epoch FROM coalesce(r.finished_at, CASE WHEN r.status = 'running' THEN now() END)
                               - r.started_at) * 1000)::bigint AS duration_ms,
           r.error, r.retry_of, r.lease_expires_at, r.scheduled_for, r.queueing_lock,
           r.args, r.result
      FROM switchboard.task_runs r
      LEFT JOIN switchboard.tasks t ON t.id = r.task_id;
COMMENT ON VIEW switchboard.runs IS
    'Runs of tasks and one-off jobs with their task''s name and duration; newest first by id. Filter and page with list_runs().';
COMMENT ON COLUMN switchboard.runs.id IS 'Run id (a larger id is a newer run).';
COMMENT ON COLUMN switchboard.runs.task_id IS 'The task, or NULL for a one-off job from enqueue().';
COMMENT ON COLUMN switchboard.runs.task_name IS 'The task''s name (NULL for a one-off job).';
COMMENT ON COLUMN switchboard.runs.handler IS 'Handler that runs it.';
COMMENT ON COLUMN switchboard.runs.status IS 'queued, running, succeeded, failed, abandoned (lease expired) or cancelled.';
COMMENT ON COLUMN switchboard.runs.trigger IS 'What created it: schedule, manual, api, cli, enqueue, retry, manual_retry.';
COMMENT ON COLUMN switchboard.runs.attempt IS 'Attempt number, 1 for the first try.';
COMMENT ON COLUMN switchboard.runs.max_attempts IS 'Attempts allowed before automatic retries stop.';
COMMENT ON COLUMN switchboard.runs.worker IS 'Worker (replica id) that claimed it.';
COMMENT ON COLUMN switchboard.runs.created_at IS 'When the run was created.';
COMMENT ON COLUMN switchboard.runs.run_at IS 'Not claimed before this time.';
COMMENT ON COLUMN switchboard.runs.started_at IS 'When it was claimed.';
COMMENT ON COLUMN switchboard.runs.finished_at IS 'When it reached a final status.';
COMMENT ON COLUMN switchboard.runs.duration IS 'finished_at - started_at; for a running run, the time so far.';
COMMENT ON COLUMN switchboard.runs.duration_ms IS 'duration in milliseconds.';
COMMENT ON COLUMN switchboard.runs.error IS 'Why it failed, was abandoned or was cancelled.';
COMMENT ON COLUMN switchboard.runs.retry_of IS 'The run this one retries; NULL for a first attempt.';
COMMENT ON COLUMN switchboard.runs.lease_expires_at IS 'Lease expiry of a running run.';
COMMENT ON COLUMN switchboard.runs.scheduled_for IS 'The tick this run is for (scheduled runs).';
COMMENT ON COLUMN switchboard.runs.queueing_lock IS 'enqueue()''s queueing lock, if any.';
COMMENT ON COLUMN switchboard.runs.args IS 'JSON arguments.';
COMMENT ON COLUMN switchboard.runs.result IS 'JSON result of a succeeded run.';
GRANT SELECT ON switchboard.runs TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard._check_run_status(status text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF status IS NOT NULL
       AND status NOT IN ('queued', 'running', 'succeeded', 'failed', 'abandoned', 'cancelled') THEN
        RAISE EXCEPTION 'invalid run status "%"', status USING ERRCODE = '22023',
            HINT = 'A run status is one of queued, running, succeeded, failed, abandoned, cancelled.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_run_status(text) FROM PUBLIC;

-- list_runs: keyset pagination, newest first. The cursor is the last id of
-- the previous page (before_id): a page is "ids below the cursor", so rows
-- inserted meanwhile never shift a page (OFFSET would repeat or skip rows).
-- It walks the primary key backwards (or task_runs_by_task /
-- task_runs_by_handler when those filters are given) and stops after
-- max_rows matches.
CREATE OR REPLACE FUNCTION switchboard.list_runs(
    status text DEFAULT NULL, handler text DEFAULT NULL, task text DEFAULT NULL,
    since timestamptz DEFAULT NULL, max_rows integer DEFAULT 50, before_id bigint DEFAULT NULL)
RETURNS SETOF switchboard.runs
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_status text := list_runs.status;
    v_handler text := list_runs.handler;
    v_task text := list_runs.task;
    v_since timestamptz := list_runs.since;
    v_before bigint := list_runs.before_id;
    v_task_id uuid;
BEGIN
    PERFORM switchboard._check_run_status(v_status);
    IF v_handler IS NOT NULL THEN
        PERFORM switchboard._check_handler(v_handler);
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023',
            HINT = 'max_rows is a page size from 1 to 1000.';
    END IF;
    IF v_task IS NOT NULL THEN
        -- A task is named by its name or its id.
        SELECT t.id INTO v_task_id FROM switchboard.tasks t
         WHERE t.name = v_task OR t.id::text = lower(v_task) LIMIT 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'task "%" does not exist', v_task USING ERRCODE = 'P0002',
                HINT = 'Name a task by its name or id: SELECT id, name FROM switchboard.tasks;';
        END IF;
    END IF;
    RETURN QUERY
    SELECT v.* FROM switchboard.runs v
     WHERE (v_before IS NULL OR v.id < v_before)
       AND (v_status IS NULL OR v.status = v_status)
       AND (v_handler IS NULL OR v.handler = v_handler)
       AND (v_task_id IS NULL OR v.task_id = v_task_id)
       AND (v_since IS NULL OR v.created_at >= v_since)
     ORDER BY v.id DESC
     LIMIT max_rows;
END
$$;
COMMENT ON FUNCTION switchboard.list_runs(text, text, text, timestamptz, integer, bigint) IS
    'Runs newest first, filtered by status, handler, task (name or id) and created since; at most max_rows (1..1000). Next page: before_id => the last id of this page. 22023 on a bad status or handler name, P0002 on an unknown task.';
REVOKE ALL ON FUNCTION switchboard.list_runs(text, text, text, timestamptz, integer, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.list_runs(text, text, text, timestamptz, integer, bigint) TO switchboard_app;

-- Who is acting, for the record a cancel leaves: the database role, and the
-- person behind it when the caller said so (the server and the CLI set
-- switchboard.actor for their transaction: the admin's username, the OS user).
-- A label, not an authority: any session may set the setting.
CREATE OR REPLACE FUNCTION switchboard._actor()
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(left(nullif(current_setting('switchboard.actor', true), ''), 100) || ' (' || session_user || ')',
                    session_user::text)
$$;
REVOKE ALL ON FUNCTION switchboard._actor() FROM PUBLIC;

-- cancel_run: a queued or a running run becomes 'cancelled' (final, never
-- retried). For a running run the row is the fence: the worker's late
-- finish_run / finish_runs / heartbeat_run / release_run all say
-- "WHERE status = 'running'" and return false. The wake-up NOTIFY at commit
-- makes every replica ask lost_runs() for its running runs, so the owner
-- tells its handler (HandlerContext.cancelled and .lease_lost) and stops it
-- within about a second, instead of at the next heartbeat (lease / 3).
CREATE OR REPLACE FUNCTION switchboard.cancel_run(run_id bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_status text;
    v_who text := switchboard._actor();
BEGIN
    UPDATE switchboard.task_runs r
       SET status = 'cancelled', finished_at = now(), lease_expires_at = NULL,
           error = CASE WHEN r.status = 'running'
                        THEN 'cancelled by ' || v_who || ' while running on ' || coalesce(r.worker, '?')
                        ELSE 'cancelled by ' || v_who || ' before it started' END
     WHERE r.id = cancel_run.run_id AND r.status IN ('queued', 'running');
    IF FOUND THEN
        PERFORM switchboard._wake_workers();
        RETURN true;
    END IF;
    SELECT r.status INTO v_status FROM switchboard.task_runs r WHERE r.id = cancel_run.run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % does not exist', run_id USING ERRCODE = 'P0002',
            HINT = 'See SELECT id, status FROM switchboard.runs ORDER BY id DESC LIMIT 20;';
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION switchboard.cancel_run(bigint) IS
    'Cancel a queued or running run: it becomes cancelled (final, not retried, counted apart from failures). A running handler is told and stopped by its replica; its late outcome is discarded (fenced). False if the run had already finished; P0002 if there is no such run.';
REVOKE ALL ON FUNCTION switchboard.cancel_run(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.cancel_run(bigint) TO switchboard_app;

-- retry_run: a new queued attempt of a finished run (any final status),
-- attempt + 1, retry_of = the old run, trigger 'manual_retry'. The old row
-- keeps its outcome. max_attempts grows to cover the new attempt, so a manual
-- retry always gets its one attempt (and no automatic retries beyond the
-- run's own budget). Exclusivity is the unique indexes' (header).
CREATE OR REPLACE FUNCTION switchboard.retry_run(run_id bigint)
RETURNS SETOF switchboard.task_runs
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_old switchboard.task_runs;
    v_new switchboard.task_runs;
    v_active record;
BEGIN
    SELECT * INTO v_old FROM switchboard.task_runs r WHERE r.id = retry_run.run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % does not exist', run_id USING ERRCODE = 'P0002',
            HINT = 'See SELECT id, status FROM switchboard.runs ORDER BY id DESC LIMIT 20;';
    END IF;
    IF v_old.status IN ('queued', 'running') THEN
        RAISE EXCEPTION 'run % is %, not finished', run_id, v_old.status USING ERRCODE = '55000',
            HINT = 'Only a finished run (succeeded, failed, abandoned, cancelled) can be retried; cancel_run() it first or wait.';
    END IF;
    INSERT INTO switchboard.task_runs
        (task_id, handler, args, status, trigger, attempt, max_attempts, queueing_lock,
         run_at, scheduled_for, retry_of)
    VALUES (v_old.task_id, v_old.handler, v_old.args, 'queued', 'manual_retry', v_old.attempt + 1,
            greatest(v_old.max_attempts, v_old.attempt + 1), v_old.queueing_lock,
            now(), v_old.scheduled_for, v_old.id)
    ON CONFLICT DO NOTHING
    RETURNING * INTO v_new;
    IF NOT FOUND THEN
        SELECT r.id, r.status INTO v_active FROM switchboard.task_runs r
         WHERE r.status IN ('queued', 'running')
           AND (r.retry_of = v_old.id
                OR (v_old.task_id IS NOT NULL AND r.task_id = v_old.task_id)
                OR (v_old.queueing_lock IS NOT NULL AND r.queueing_lock = v_old.queueing_lock))
         LIMIT 1;
        RAISE EXCEPTION 'run % cannot be retried: run % is already %', run_id,
                        coalesce(v_active.id::text, '?'), coalesce(v_active.status, 'active')
            USING ERRCODE = '55000',
                  HINT = 'A task (or queueing lock, or failed run) has at most one queued or running run; wait for it or cancel_run() it.';
    END IF;
    PERFORM switchboard._wake_workers();
    RETURN NEXT v_new;
END
$$;
COMMENT ON FUNCTION switchboard.retry_run(bigint) IS
    'Queue a new attempt of a finished run (attempt + 1, retry_of = run_id, trigger manual_retry) and return it. P0002 if there is no such run; 55000 if the run is still queued or running, or if its task / queueing lock / own retry already has a queued or running run.';
REVOKE ALL ON FUNCTION switchboard.retry_run(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.retry_run(bigint) TO switchboard_app;

-- lost_runs: which of the runs a worker believes it is running it no longer
-- owns (cancelled, rescued, deleted). One probe of the primary key per id; a
-- replica asks it when it hears switchboard_runs while it has runs going.
CREATE OR REPLACE FUNCTION switchboard.lost_runs(worker text, run_ids bigint[])
RETURNS TABLE (run_id bigint, status text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT x.id, r.status
      FROM unnest(lost_runs.run_ids) AS x(id)
      LEFT JOIN switchboard.task_runs r ON r.id = x.id
     WHERE r.id IS NULL OR r.status <> 'running' OR r.worker IS DISTINCT FROM lost_runs.worker
$$;
COMMENT ON FUNCTION switchboard.lost_runs(text, bigint[]) IS
    'Of run_ids, those that worker no longer owns as running (status: cancelled, abandoned, ... or NULL if the run is gone). A replica stops their handlers.';
REVOKE ALL ON FUNCTION switchboard.lost_runs(text, bigint[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.lost_runs(text, bigint[]) TO switchboard_app;

-- pause_handler / resume_handler. A pause holds the handler's queued runs and
-- its tasks' due ticks; runs already running go on (cancel_run() them if they
-- must stop). A claim statement that started before the pause committed may
-- still take one unit of the handler's work; every claim after it does not.
-- Resuming wakes the workers: held work is claimed at once, and each held
-- task fires once for the ticks it missed (its catch-up rule).
CREATE OR REPLACE FUNCTION switchboard.pause_handler(name text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_handler(pause_handler.name);
    INSERT INTO switchboard.paused_handlers (handler, paused_by) VALUES (pause_handler.name, session_user)
    ON CONFLICT (handler) DO NOTHING;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION switchboard.pause_handler(text) IS
    'Hold a handler''s work: claims skip its queued runs and its tasks'' due ticks (running runs go on). True if it was not paused yet. 22023 on an invalid name. Undo with resume_handler().';
REVOKE ALL ON FUNCTION switchboard.pause_handler(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.pause_handler(text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.resume_handler(name text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_handler(resume_handler.name);
    DELETE FROM switchboard.paused_handlers p WHERE p.handler = resume_handler.name;
    IF FOUND THEN
        PERFORM switchboard._wake_workers();
        RETURN true;
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION switchboard.resume_handler(text) IS
    'Release a paused handler: its held runs are claimed at once and each of its tasks fires once for the ticks it missed. True if it was paused. 22023 on an invalid name.';
REVOKE ALL ON FUNCTION switchboard.resume_handler(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.resume_handler(text) TO switchboard_app;

-- notify_admins: one event to every enabled admin, through notify_user (so it
-- is delivered iff the caller commits, and resumable). The server calls it
-- with run.updated after an operator's cancel or retry, last in the same
-- transaction (notify_* hold the event-order lock until commit: publish last).
CREATE OR REPLACE FUNCTION switchboard.notify_admins(event text, payload jsonb DEFAULT '{}')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer := 0;
    v_user uuid;
BEGIN
    FOR v_user IN SELECT u.id FROM switchboard.users u WHERE u.role = 'admin' AND NOT u.disabled ORDER BY u.id LOOP
        PERFORM switchboard.notify_user(v_user, notify_admins.event, notify_admins.payload);
        v_n := v_n + 1;
    END LOOP;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.notify_admins(text, jsonb) IS
    'Send one event to every enabled admin (notify_user each; delivered iff the transaction commits). Returns how many admins. Call it last in a transaction.';
REVOKE ALL ON FUNCTION switchboard.notify_admins(text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.notify_admins(text, jsonb) TO switchboard_app;

-- How many handlers are paused, for status(). PL/pgSQL: resolved when called
-- (see _tasks_broken in 20_scheduler.sql).
CREATE OR REPLACE FUNCTION switchboard._handlers_paused()
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT count(*) FROM switchboard.paused_handlers);
END
$$;
REVOKE ALL ON FUNCTION switchboard._handlers_paused() FROM PUBLIC;

-- db/functions/30_tickets.sql
-- WebSocket tickets: short-lived, single-use, stored only as a SHA-256 hash
-- in an UNLOGGED table (a crash loses at most 30 seconds of tickets, which
-- clients simply re-request). Consumption is one DELETE ... RETURNING: two
-- replicas consuming the same ticket at the same instant serialise on the
-- row, and the second DELETE finds nothing.

-- 128 random bits without pgcrypto: gen_random_uuid() draws from the same
-- strong source (pg_strong_random); the version/variant bits (bytes 7 and 9 of
-- a version 4 UUID) are skipped, so all 16 bytes taken below are random.
-- Shaped to be inlined into its caller: one expression, no FROM, no SET clause
-- (a SET clause or a FROM forbids inlining, and a SQL function that is not
-- inlined is parsed and planned again in every transaction that calls it:
-- that doubled the cost of issue_ticket). Every name is schema-qualified, so
-- the body means the same under any search_path.
CREATE OR REPLACE FUNCTION switchboard._random_128()
RETURNS bytea
LANGUAGE sql VOLATILE
AS $$
    SELECT pg_catalog.substr(pg_catalog.uuid_send(pg_catalog.gen_random_uuid()), 1, 6)
           OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.uuid_send(pg_catalog.gen_random_uuid()), 10, 7)
           OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.uuid_send(pg_catalog.gen_random_uuid()), 1, 3)
$$;
REVOKE ALL ON FUNCTION switchboard._random_128() FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard.issue_ticket(user_id uuid, ttl interval DEFAULT '30 seconds')
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_raw bytea := switchboard._random_128();
    v_disabled boolean;
BEGIN
    IF ttl IS NULL OR ttl <= interval '0' OR ttl > interval '1 hour' THEN
        RAISE EXCEPTION 'invalid ticket ttl "%"', ttl USING ERRCODE = '22023',
            HINT = 'A ticket lives between 1 second and 1 hour; default 30 seconds.';
    END IF;
    SELECT u.disabled INTO v_disabled FROM switchboard.users u WHERE u.id = issue_ticket.user_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user % does not exist', issue_ticket.user_id USING ERRCODE = 'P0002';
    END IF;
    IF v_disabled THEN
        RAISE EXCEPTION 'user % is disabled', issue_ticket.user_id USING ERRCODE = '28000',
            HINT = 'A disabled user cannot get a ticket; see enable_user().';
    END IF;
    INSERT INTO switchboard.tickets (hash, user_id, expires_at)
    VALUES (sha256(v_raw), issue_ticket.user_id, now() + ttl);
    RETURN encode(v_raw, 'hex');
END
$$;
COMMENT ON FUNCTION switchboard.issue_ticket(uuid, interval) IS
    'Issue a single-use WebSocket ticket for user_id: 128 random bits as 32 hex characters. Only its SHA-256 is stored. P0002 for an unknown user, 28000 for a disabled one.';
REVOKE ALL ON FUNCTION switchboard.issue_ticket(uuid, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.issue_ticket(uuid, interval) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.consume_ticket(ticket text)
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user uuid;
    v_expires timestamptz;
BEGIN
    IF ticket IS NULL OR ticket !~ '^[0-9A-Fa-f]{32}$' THEN
        RETURN NULL;
    END IF;
    DELETE FROM switchboard.tickets t WHERE t.hash = sha256(decode(lower(ticket), 'hex'))
    RETURNING t.user_id, t.expires_at INTO v_user, v_expires;
    IF NOT FOUND OR v_expires <= clock_timestamp() THEN
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM switchboard.users u WHERE u.id = v_user AND NOT u.disabled) THEN
        RETURN NULL;
    END IF;
    RETURN v_user;
END
$$;
COMMENT ON FUNCTION switchboard.consume_ticket(text) IS
    'Consume a ticket: the user id, exactly once; NULL if the ticket is unknown, malformed, expired, already used or its user is disabled.';
REVOKE ALL ON FUNCTION switchboard.consume_ticket(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.consume_ticket(text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.reap_tickets()
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    DELETE FROM switchboard.tickets t WHERE t.expires_at <= now();
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_tickets() IS 'Delete expired tickets. Returns how many.';
REVOKE ALL ON FUNCTION switchboard.reap_tickets() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_tickets() TO switchboard_app;

-- db/functions/40_ratelimit.sql
-- Rate limits: GCRA (the token bucket as a single timestamp). One UNLOGGED
-- row per key holds the theoretical arrival time (tat, microseconds since the
-- epoch, database clock). A request of cost c with emission interval T = 1/rate
-- is admitted iff max(tat, now) + c*T - now <= burst*T. The decision is one
-- INSERT ... ON CONFLICT DO UPDATE ... WHERE: the row lock serialises every
-- replica's callers, and a denied request (WHERE false) writes nothing.
-- The raising half of rate_check's argument check: called only when the one
-- combined test in rate_check fails, so the hot path evaluates one condition.
CREATE OR REPLACE FUNCTION switchboard._rate_check_raise(key text, rate double precision, burst integer, cost integer)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF key IS NULL OR length(key) = 0 OR length(key) > 512 THEN
        RAISE EXCEPTION 'invalid rate-limit key "%"', key USING ERRCODE = '22023',
            HINT = 'A key is 1 to 512 characters, e.g. ''login:ip:203.0.113.7''.';
    END IF;
    IF rate IS NULL OR NOT (rate > 0) OR rate = 'Infinity'::float8 OR rate > 1000000 THEN
        RAISE EXCEPTION 'invalid rate %', rate USING ERRCODE = '22023',
            HINT = 'rate is requests per second: > 0 and <= 1000000.';
    END IF;
    IF burst IS NULL OR burst < 1 THEN
        RAISE EXCEPTION 'invalid burst %', burst USING ERRCODE = '22023', HINT = 'burst is at least 1.';
    END IF;
    IF cost IS NULL OR cost < 1 OR cost > burst THEN
        RAISE EXCEPTION 'invalid cost % for burst %', cost, burst USING ERRCODE = '22023',
            HINT = 'cost is between 1 and burst: a request costing more than the burst could never pass.';
    END IF;
    RAISE EXCEPTION 'invalid rate_check arguments' USING ERRCODE = '22023';
END
$$;
REVOKE ALL ON FUNCTION switchboard._rate_check_raise(text, double precision, integer, integer) FROM PUBLIC;

-- Each top-level call is its own transaction, and PL/pgSQL prepares every
-- simple expression again in each new transaction (~1-2 us each): the body
-- keeps their number down (one combined argument check, no copies of the
-- arguments). Profile and floor: V0013 and BENCHMARKS.md "Scale".
CREATE OR REPLACE FUNCTION switchboard.rate_check(
    key text, rate double precision, burst integer, cost integer DEFAULT 1)
RETURNS TABLE (allowed boolean, remaining integer, retry_after_ms integer, reset_after_ms integer)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_now bigint := (extract(epoch FROM now()) * 1000000)::bigint;
    v_t double precision;
    v_inc bigint;
    v_tol bigint;
    v_tat bigint;
BEGIN
    -- NaN > 0 is true in PostgreSQL, NaN <= 1000000 is not; NULLs make it NULL.
    IF (length(rate_check.key) BETWEEN 1 AND 512 AND rate > 0 AND rate <= 1000000
        AND burst >= 1 AND cost BETWEEN 1 AND burst) IS NOT TRUE THEN
        PERFORM switchboard._rate_check_raise(rate_check.key, rate, burst, cost);
    END IF;
    v_t := 1000000.0 / rate;
    v_inc := round(cost * v_t)::bigint;
    v_tol := round(burst * v_t)::bigint;

    INSERT INTO switchboard.rate_limits AS r (key, tat_us, updated_at)
    VALUES (rate_check.key, v_now + v_inc, now())
    ON CONFLICT ON CONSTRAINT rate_limits_pkey DO UPDATE
       SET tat_us = greatest(r.tat_us, v_now) + v_inc, updated_at = now()
     WHERE greatest(r.tat_us, v_now) + v_inc - v_now <= v_tol
    RETURNING r.tat_us INTO v_tat;

    allowed := FOUND;
    IF NOT allowed THEN
        -- Denied: the row is locked by the ON CONFLICT above, so this read is exact.
        SELECT greatest(r.tat_us, v_now) INTO v_tat FROM switchboard.rate_limits r WHERE r.key = rate_check.key;
    END IF;
    retry_after_ms := CASE WHEN allowed THEN 0 ELSE ceil((v_tat + v_inc - v_now - v_tol) / 1000.0)::integer END;
    remaining := greatest(0, floor((v_tol - (v_tat - v_now)) / v_t + 1e-9))::integer;
    reset_after_ms := greatest(0, ceil((v_tat - v_now) / 1000.0))::integer;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION switchboard.rate_check(text, double precision, integer, integer) IS
    'Token bucket (GCRA) per key: a fresh key admits exactly burst requests at once, then rate per second. A denied request consumes nothing; retry_after_ms says when it would pass; reset_after_ms when the bucket is full again. Same answer on every replica (database clock).';
REVOKE ALL ON FUNCTION switchboard.rate_check(text, double precision, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.rate_check(text, double precision, integer, integer) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.rate_reset(key text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM switchboard.rate_limits r WHERE r.key = rate_reset.key;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION switchboard.rate_reset(text) IS
    'Forget a key: its bucket is full again. True if the key existed.';
REVOKE ALL ON FUNCTION switchboard.rate_reset(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.rate_reset(text) TO switchboard_app;

-- reap_rate_limits: bounded since V0013 (see reap_runs). rate_limits has no
-- index but its key: an index on updated_at would be written by every
-- rate_check and end its HOT updates. The batch is found by a scan that stops
-- after max_rows idle keys, so a call costs at most one pass over the table.
CREATE OR REPLACE FUNCTION switchboard.reap_rate_limits(idle interval, max_rows integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
    v_now bigint := (extract(epoch FROM now()) * 1000000)::bigint;
BEGIN
    IF idle IS NULL OR idle < interval '0' THEN
        RAISE EXCEPTION 'invalid idle interval "%"', idle USING ERRCODE = '22023',
            HINT = 'idle is a non-negative interval such as ''1 hour''.';
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023',
            HINT = 'max_rows bounds one call (one transaction): 1 to 1000000; 10000 is the default batch.';
    END IF;
    -- Only buckets that are full again (tat in the past) may go: deleting a
    -- bucket that still holds debt would hand out a fresh burst. SKIP LOCKED:
    -- a key being checked right now is busy, not idle.
    DELETE FROM switchboard.rate_limits r
     WHERE r.ctid = ANY (ARRAY(SELECT o.ctid FROM switchboard.rate_limits o
                                WHERE o.updated_at < now() - idle AND o.tat_us <= v_now
                                LIMIT max_rows FOR UPDATE SKIP LOCKED))
       AND r.updated_at < now() - idle AND r.tat_us <= v_now;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_rate_limits(interval, integer) IS
    'Delete at most max_rows rate-limit keys untouched for idle whose bucket is full again. Returns how many; max_rows back means more are due (call again, in a new transaction).';
REVOKE ALL ON FUNCTION switchboard.reap_rate_limits(interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_rate_limits(interval, integer) TO switchboard_app;

-- The previous release's entry point: one batch of 10,000 (the documented batch size).
CREATE OR REPLACE FUNCTION switchboard.reap_rate_limits(idle interval DEFAULT '1 hour')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN switchboard.reap_rate_limits(idle, 10000);
END
$$;
COMMENT ON FUNCTION switchboard.reap_rate_limits(interval) IS
    'Delete rate-limit keys untouched for idle whose bucket is full again, at most 10000 per call (one batch; see reap_rate_limits(interval, integer)). Returns how many.';
REVOKE ALL ON FUNCTION switchboard.reap_rate_limits(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_rate_limits(interval) TO switchboard_app;

-- db/functions/50_events.sql
-- Events: targeted, transactional notify.
--
-- The event lives in switchboard.events (payloads up to 1 MiB). At COMMIT a
-- NOTIFY on channel switchboard_events wakes every replica's relay; it
-- carries only the id ({"id": N}) and is dropped on ROLLBACK. NOTIFY has no
-- permissions (any role that can connect may pg_notify anything, and LISTEN
-- to anything), so the payload is a hint: the relay reads what the ticks say
-- it has not read yet (relay_read_v2) and delivers what it read, never what it
-- was told (docs/security.md). The body never travels on the bus either, so a
-- LISTENing stranger learns ids, not contents.
--
-- Order without a lock (V0009, PgQ's design). Publishers take no lock: an id
-- comes from the sequence at insert time, so ids do NOT follow commit order.
-- Each row records the inserting transaction (events.xid, xid8). A tick
-- (event_tick, run by whichever relay gets the ticker row first) records a
-- snapshot; batch k = the events whose transaction is visible in tick k's
-- snapshot and not in tick k-1's. Every snapshot sees a transaction either
-- not at all or as committed, and tick k's snapshot contains tick k-1's, so
-- every committed event lands in exactly one batch, whatever order the
-- transactions commit in. The delivery order is (batch, id); a position in it
-- is (tick, id) -- the resume cursor. A transaction held open holds back
-- nothing but its own events: later ticks include everything else.
--
-- The former design (publishers serialised on switchboard.event_order until
-- COMMIT) stays below as _lock_event_order, unused since V0009, dropped a
-- release later.

CREATE OR REPLACE FUNCTION switchboard._check_event(event text, payload jsonb, max_bytes integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_size integer;
BEGIN
    IF event IS NULL OR event !~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$' THEN
        RAISE EXCEPTION 'invalid event label "%"', event USING ERRCODE = '22023',
            HINT = 'An event label is 1 to 128 characters: letters, digits, _ . : -';
    END IF;
    IF payload IS NULL THEN
        RAISE EXCEPTION 'event payload must not be NULL' USING ERRCODE = '22023', HINT = 'Use ''{}''::jsonb.';
    END IF;
    v_size := octet_length(payload::text);
    IF v_size > max_bytes THEN
        RAISE EXCEPTION 'event payload is % bytes, the limit is %', v_size, max_bytes
            USING ERRCODE = '22023', HINT = 'Store large data elsewhere and send a reference.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_event(text, jsonb, integer) FROM PUBLIC;

-- Take the event-order lock. Uncontended (the common case) it is one
-- SKIP LOCKED probe and no subtransaction; contended, it waits at most
-- event_order.lock_wait (or the caller's shorter lock_timeout) inside a
-- BEGIN/EXCEPTION block so the timeout surfaces as a clear 55P03.
CREATE OR REPLACE FUNCTION switchboard._lock_event_order()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_wait interval;
    v_caller text := current_setting('lock_timeout');
    v_ms bigint;
BEGIN
    PERFORM 1 FROM switchboard.event_order o WHERE o.singleton FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT o.lock_wait INTO v_wait FROM switchboard.event_order o WHERE o.singleton;
    v_ms := (extract(epoch FROM coalesce(v_wait, interval '5 seconds')) * 1000)::bigint;
    IF v_caller NOT IN ('0', '0ms') THEN
        v_ms := least(v_ms, (extract(epoch FROM v_caller::interval) * 1000)::bigint);
    END IF;
    BEGIN
        PERFORM set_config('lock_timeout', v_ms::text, true);
        PERFORM 1 FROM switchboard.event_order o WHERE o.singleton FOR UPDATE;
        PERFORM set_config('lock_timeout', v_caller, true);
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'waited % ms for the event-order lock; another publisher has not committed', v_ms
            USING ERRCODE = '55P03',
                  HINT = 'A transaction that calls notify_user/notify_room holds the lock until it ends: '
                      || 'publish last and commit promptly. The bound is switchboard.event_order.lock_wait.';
    END;
END
$$;
REVOKE ALL ON FUNCTION switchboard._lock_event_order() FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard._publish(user_id uuid, room text, event text, payload jsonb)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    -- No lock: order comes from ticks (events.xid defaults to this transaction's id).
    v_id := nextval('switchboard.event_id_seq');
    INSERT INTO switchboard.events (id, user_id, room, event, payload, created_at)
    VALUES (v_id, _publish.user_id, _publish.room, _publish.event, _publish.payload, clock_timestamp());
    -- A hint only: the relay ticks and reads what the ticks say it has not read. One
    -- per transaction is enough (the relay reads everything the next tick covers): the
    -- marker is transaction-local and is undone with a rolled-back subtransaction,
    -- exactly like the NOTIFY it stands for. With publishers_notify off there is none:
    -- the relays' ticker polls (see event_ticker).
    IF current_setting('switchboard.event_notified', true) IS DISTINCT FROM 'on'
       AND (SELECT t.publishers_notify FROM switchboard.event_ticker t WHERE t.singleton) THEN
        PERFORM pg_notify('switchboard_events', '{"id":' || v_id || '}');
        PERFORM set_config('switchboard.event_notified', 'on', true);
    END IF;
    RETURN v_id;
END
$$;
REVOKE ALL ON FUNCTION switchboard._publish(uuid, text, text, jsonb) FROM PUBLIC;

-- Ephemeral events (typing, tool.call.<id>): stored for about a minute in an
-- UNLOGGED table, never in events (no id in the event stream, not resumed).
-- The NOTIFY carries {"eph": id}; relays read the row with relay_read().
CREATE OR REPLACE FUNCTION switchboard._publish_ephemeral(user_id uuid, room text, event text,
                                                          sender uuid, payload jsonb)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO switchboard.ephemeral_events (user_id, room, event, sender, payload)
    VALUES (_publish_ephemeral.user_id, _publish_ephemeral.room, _publish_ephemeral.event,
            _publish_ephemeral.sender, _publish_ephemeral.payload)
    RETURNING id INTO v_id;
    PERFORM pg_notify('switchboard_events', '{"eph":' || v_id || '}');
    RETURN v_id;
END
$$;
REVOKE ALL ON FUNCTION switchboard._publish_ephemeral(uuid, text, text, uuid, jsonb) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard.notify_user(user_id uuid, event text, payload jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_event(event, payload, 1048576);
    IF user_id IS NULL OR NOT EXISTS (SELECT 1 FROM switchboard.users u WHERE u.id = notify_user.user_id) THEN
        RAISE EXCEPTION 'user % does not exist', user_id USING ERRCODE = 'P0002';
    END IF;
    RETURN switchboard._publish(user_id, NULL, event, payload);
END
$$;
COMMENT ON FUNCTION switchboard.notify_user(uuid, text, jsonb) IS
    'Publish an event to every socket of user_id on every replica, iff the calling transaction commits. Returns the event id (unique, increasing in insert order, not commit order: the delivery order is ticks, see events_since_v2). Payload up to 1 MiB. Takes no lock: publishers never wait for each other.';
REVOKE ALL ON FUNCTION switchboard.notify_user(uuid, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.notify_user(uuid, text, jsonb) TO switchboard_app;

-- A room with no members (or an unknown room) is not an error: the event is
-- stored and delivered to nobody live, like a NOTIFY nobody listens to. A
-- publisher's transaction must not abort because nobody is listening; typos
-- show up in room_members_online() and status(). The name is still checked.
CREATE OR REPLACE FUNCTION switchboard.notify_room(room text, event text, payload jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_event(event, payload, 1048576);
    IF room IS NULL OR room !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' THEN
        RAISE EXCEPTION 'invalid room name "%"', room USING ERRCODE = '22023',
            HINT = 'A room name is 1 to 128 characters: letters, digits, _ . : -';
    END IF;
    RETURN switchboard._publish(NULL, room, event, payload);
END
$$;
COMMENT ON FUNCTION switchboard.notify_room(text, text, jsonb) IS
    'Publish an event to every member of room with a socket joined to it, on every replica, iff the calling transaction commits. Returns the event id. A room without members is not an error (stored, delivered to nobody live). Takes no lock.';
REVOKE ALL ON FUNCTION switchboard.notify_room(text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.notify_room(text, text, jsonb) TO switchboard_app;

-- events_since: the resume cursor. Targeted events of this user plus events of
-- the given rooms *that the user is a member of* (a room the user does not
-- belong to yields nothing), in id (= commit) order.
CREATE OR REPLACE FUNCTION switchboard.events_since(
    user_id uuid, after_id bigint, rooms text[] DEFAULT '{}', max_rows integer DEFAULT 10000)
RETURNS SETOF switchboard.events
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_user uuid := events_since.user_id;
BEGIN
    IF after_id IS NULL OR after_id < 0 THEN
        RAISE EXCEPTION 'invalid after_id %', after_id USING ERRCODE = '22023',
            HINT = 'after_id is the last event id the client saw (0 for everything retained).';
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    SELECT e.* FROM (
        SELECT * FROM switchboard.events ue
         WHERE ue.user_id = v_user AND ue.id > after_id
        UNION ALL
        SELECT re.* FROM switchboard.events re
          JOIN switchboard.room_members m ON m.room = re.room AND m.user_id = v_user
         WHERE re.room = ANY (coalesce(rooms, '{}')) AND re.id > after_id
    ) e
    ORDER BY e.id
    LIMIT max_rows;
END
$$;
COMMENT ON FUNCTION switchboard.events_since(uuid, bigint, text[], integer) IS
    'What user_id missed after after_id: its own events and events of the given rooms it belongs to, in commit order. Complete: once id N was seen, no event with id <= N can still commit. Compare after_id with event_horizon() to detect a gap past retention.';
REVOKE ALL ON FUNCTION switchboard.events_since(uuid, bigint, text[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.events_since(uuid, bigint, text[], integer) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.event_horizon()
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT h.reaped_through FROM switchboard.event_horizon h);
END
$$;
COMMENT ON FUNCTION switchboard.event_horizon() IS
    'The highest event id deleted by reap_events(). A client resuming after an id below it may have missed events (resume_gap).';
REVOKE ALL ON FUNCTION switchboard.event_horizon() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.event_horizon() TO switchboard_app;

-- Kept for a previous-release relay during a rolling update (it read events
-- whose NOTIFY was truncated); this release reads with relay_read().
CREATE OR REPLACE FUNCTION switchboard._relay_fetch_event(event_id bigint)
RETURNS SETOF switchboard.events
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM switchboard.events e WHERE e.id = event_id;
END
$$;
COMMENT ON FUNCTION switchboard._relay_fetch_event(bigint) IS
    'Internal (relay): read one event whose NOTIFY was truncated because its payload did not fit.';
REVOKE ALL ON FUNCTION switchboard._relay_fetch_event(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard._relay_fetch_event(bigint) TO switchboard_app;

-- The relay's read, once per LISTEN wake-up (not per notification, not per
-- socket): every stored event after the replica's cursor, in id (= commit)
-- order, plus the ephemeral events whose ids the wake-ups named. The ids in a
-- NOTIFY are hints: a forged id names no row, or a row the relay has already
-- delivered (its cursor and recently-seen set skip it); the cursor only ever
-- moves to ids read here. Ephemeral rows older than 30 seconds are not
-- returned, so an old id replayed on the bus delivers nothing.
CREATE OR REPLACE FUNCTION switchboard.relay_read(after_id bigint, ephemeral_ids bigint[] DEFAULT '{}',
                                                  max_rows integer DEFAULT 1000)
RETURNS TABLE (id bigint, ephemeral boolean, user_id uuid, room text, event text, sender uuid,
               payload jsonb, ts bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF after_id IS NULL OR after_id < 0 THEN
        RAISE EXCEPTION 'invalid after_id %', after_id USING ERRCODE = '22023',
            HINT = 'after_id is the relay cursor: the highest event id it has read (see event_head()).';
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023', HINT = 'Between 1 and 100000.';
    END IF;
    IF cardinality(ephemeral_ids) > 10000 THEN
        RAISE EXCEPTION 'too many ephemeral ids (%)', cardinality(ephemeral_ids) USING ERRCODE = '22023',
            HINT = 'At most 10000 per read.';
    END IF;
    RETURN QUERY
    (SELECT e.id, false, e.user_id, e.room, e.event, NULL::uuid, e.payload,
            (extract(epoch FROM e.created_at) * 1000)::bigint
       FROM switchboard.events e WHERE e.id > after_id ORDER BY e.id LIMIT max_rows)
    UNION ALL
    (SELECT x.id, true, x.user_id, x.room, x.event, x.sender, x.payload,
            (extract(epoch FROM x.created_at) * 1000)::bigint
       FROM switchboard.ephemeral_events x
      WHERE x.id = ANY (coalesce(ephemeral_ids, '{}'))
        AND x.created_at > now() - interval '30 seconds'
      ORDER BY x.id);
END
$$;
COMMENT ON FUNCTION switchboard.relay_read(bigint, bigint[], integer) IS
    'Internal (relay): stored events after the cursor after_id in commit order (at most max_rows), then the ephemeral events with the given ids (younger than 30 s). What a replica delivers; NOTIFY payloads only say when to call it.';
REVOKE ALL ON FUNCTION switchboard.relay_read(bigint, bigint[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.relay_read(bigint, bigint[], integer) TO switchboard_app;

-- Where a relay starts its cursor: the highest committed event id (or the
-- reaped horizon when nothing is retained). Ids are commit-ordered, so no
-- event with a lower id can still appear.
CREATE OR REPLACE FUNCTION switchboard.event_head()
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN greatest(coalesce((SELECT max(e.id) FROM switchboard.events e), 0),
                    (SELECT h.reaped_through FROM switchboard.event_horizon h));
END
$$;
COMMENT ON FUNCTION switchboard.event_head() IS
    'The highest event id committed so far: a relay''s starting cursor for relay_read().';
REVOKE ALL ON FUNCTION switchboard.event_head() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.event_head() TO switchboard_app;

-- The ticker. Whichever relay gets the ticker row (FOR UPDATE SKIP LOCKED)
-- records a tick when events became visible since the last one, and -- when
-- publishers do not NOTIFY (event_ticker.publishers_notify off) -- wakes every
-- relay once for the whole batch ({"tick": k} on switchboard_events).
-- No leader: any replica ticks, a replica dying mid-tick releases the row with
-- its connection, and a skipped caller just tries again (-1 says "busy").
-- The snapshot is taken by the INSERT, a statement after the lock was taken,
-- so it sees the previous tick's transaction committed: each tick's snapshot
-- contains the previous one's, and tick numbers follow snapshot order.
-- It must run in its own transaction: it holds the ticker row until COMMIT.
CREATE OR REPLACE FUNCTION switchboard.event_tick()
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_prev pg_snapshot;
    v_tick bigint;
BEGIN
    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'event_tick() called in a transaction that already wrote' USING ERRCODE = '25001',
            HINT = 'Call it in a transaction of its own (autocommit): it holds the ticker row until the transaction ends.';
    END IF;
    -- Read-only first: when nothing became visible since the newest tick (the common
    -- answer for every replica but the first to hear a publisher), no lock, no xid, no
    -- WAL. Whatever woke the caller committed before this statement's snapshot, so
    -- "nothing new" means the newest tick already covers it.
    SELECT k.snap INTO v_prev FROM switchboard.event_ticks k ORDER BY k.tick DESC LIMIT 1;
    IF v_prev IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM switchboard.events e WHERE e.xid >= pg_snapshot_xmax(v_prev))
       AND NOT EXISTS (SELECT 1 FROM switchboard.events e
                        WHERE e.xid = ANY (ARRAY(SELECT pg_snapshot_xip(v_prev)))) THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM switchboard.event_ticker t WHERE t.singleton FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN -1;
    END IF;
    SELECT k.snap INTO v_prev FROM switchboard.event_ticks k ORDER BY k.tick DESC LIMIT 1;
    INSERT INTO switchboard.event_ticks (tick, snap, snap_xmax)
    SELECT nextval('switchboard.event_tick_seq'), pg_current_snapshot(), pg_snapshot_xmax(pg_current_snapshot())
     WHERE v_prev IS NULL
        OR EXISTS (SELECT 1 FROM switchboard.events e WHERE e.xid >= pg_snapshot_xmax(v_prev))
        OR EXISTS (SELECT 1 FROM switchboard.events e
                    WHERE e.xid = ANY (ARRAY(SELECT pg_snapshot_xip(v_prev))))
    RETURNING tick INTO v_tick;
    IF v_tick IS NULL THEN
        RETURN 0;
    END IF;
    -- The batch's one wake-up, needed only when publishers are silent: otherwise every
    -- relay heard the publisher and ticks (or finds the tick) itself, and a NOTIFY here
    -- would put NOTIFY's commit lock on every delivery's path for nothing.
    IF NOT (SELECT t.publishers_notify FROM switchboard.event_ticker t WHERE t.singleton) THEN
        PERFORM pg_notify('switchboard_events', '{"tick":' || v_tick || '}');
    END IF;
    RETURN v_tick;
END
$$;
COMMENT ON FUNCTION switchboard.event_tick() IS
    'Internal (relay): record a tick if events became visible since the last one (and NOTIFY {"tick": k} once for the batch when publishers_notify is off). Returns the new tick, 0 if nothing new, -1 if another replica is ticking right now (try again shortly). Run it in a transaction of its own.';
REVOKE ALL ON FUNCTION switchboard.event_tick() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.event_tick() TO switchboard_app;

-- Every read of the event stream: the events after position (after_tick,
-- after_id) in (batch, id) order, through tick through_tick (NULL: the newest),
-- at most max_rows; only_user NULL for all events, else that user's own events
-- and those of the given rooms it is a member of. after_id = 9223372036854775807
-- means "all of after_tick's batch". Works in windows of up to 500 ticks so a
-- long catch-up reads each event once: candidates are found by events_xid
-- (not visible in the window's first snapshot, below the last one's xmax), and
-- each candidate's batch is the first tick in the window whose snapshot sees
-- it. A position older than the retained ticks reads from the oldest one (the
-- caller decides about resume_gap with event_window()).
CREATE OR REPLACE FUNCTION switchboard._events_after(
    only_user uuid, rooms text[], after_tick bigint, after_id bigint, through_tick bigint, max_rows integer)
RETURNS TABLE (tick bigint, id bigint, user_id uuid, room text, event text, payload jsonb, created_at timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_lo bigint;
    v_lo_snap pg_snapshot;
    v_lo_xip xid8[];
    v_hi bigint;
    v_hi_snap pg_snapshot;
    v_left integer := max_rows;
    v_n integer;
    v_rooms text[] := '{}';
BEGIN
    SELECT k.tick, k.snap INTO v_lo, v_lo_snap FROM switchboard.event_ticks k
     WHERE k.tick < after_tick OR (k.tick = after_tick AND after_id = 9223372036854775807)
     ORDER BY k.tick DESC LIMIT 1;
    IF v_lo IS NULL THEN
        v_lo := 0;
        v_lo_snap := '1:1:'::pg_snapshot;   -- before every retained tick: nothing seen
    END IF;
    IF only_user IS NOT NULL THEN
        v_rooms := ARRAY(SELECT m.room FROM switchboard.room_members m
                          WHERE m.user_id = only_user AND m.room = ANY (coalesce(rooms, '{}')));
    END IF;
    LOOP
        SELECT w.tick, w.snap INTO v_hi, v_hi_snap FROM (
            SELECT k.tick, k.snap FROM switchboard.event_ticks k
             WHERE k.tick > v_lo AND (through_tick IS NULL OR k.tick <= through_tick)
             ORDER BY k.tick LIMIT 500) w
         ORDER BY w.tick DESC LIMIT 1;
        EXIT WHEN v_hi IS NULL;
        v_lo_xip := ARRAY(SELECT pg_snapshot_xip(v_lo_snap));
        RETURN QUERY
        SELECT b.tick, e.id, e.user_id, e.room, e.event, e.payload, e.created_at
          FROM switchboard.events e
         CROSS JOIN LATERAL (
                SELECT k.tick FROM switchboard.event_ticks k
                 WHERE k.tick > v_lo AND k.tick <= v_hi AND pg_visible_in_snapshot(e.xid, k.snap)
                 ORDER BY k.tick LIMIT 1) b
         WHERE ((e.xid >= pg_snapshot_xmax(v_lo_snap) AND e.xid < pg_snapshot_xmax(v_hi_snap))
                OR e.xid = ANY (v_lo_xip))
           AND (only_user IS NULL OR e.user_id = only_user OR e.room = ANY (v_rooms))
           AND (b.tick > after_tick OR (b.tick = after_tick AND e.id > after_id))
         ORDER BY b.tick, e.id
         LIMIT v_left;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_left := v_left - v_n;
        EXIT WHEN v_left <= 0;
        v_lo := v_hi;
        v_lo_snap := v_hi_snap;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION switchboard._events_after(uuid, text[], bigint, bigint, bigint, integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard._check_position(after_tick bigint, after_id bigint, max_rows integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF after_tick IS NULL OR after_tick < 0 OR after_id IS NULL OR after_id < 0 THEN
        RAISE EXCEPTION 'invalid position (%, %)', after_tick, after_id USING ERRCODE = '22023',
            HINT = 'A position is (tick, last event id) from an event''s cursor; (0, 0) is the start of what is retained.';
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023', HINT = 'Between 1 and 100000.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_position(bigint, bigint, integer) FROM PUBLIC;

-- The resume read (the v2 of events_since: a position instead of an id).
CREATE OR REPLACE FUNCTION switchboard.events_since_v2(
    user_id uuid, after_tick bigint, after_id bigint, rooms text[] DEFAULT '{}',
    through_tick bigint DEFAULT NULL, max_rows integer DEFAULT 10000)
RETURNS TABLE (tick bigint, id bigint, room text, event text, payload jsonb, created_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_position(after_tick, after_id, max_rows);
    IF user_id IS NULL THEN
        RAISE EXCEPTION 'user_id must not be NULL' USING ERRCODE = '22023', HINT = 'Whose events to read.';
    END IF;
    RETURN QUERY
    SELECT a.tick, a.id, a.room, a.event, a.payload, a.created_at
      FROM switchboard._events_after(user_id, rooms, after_tick, after_id, through_tick, max_rows) a;
END
$$;
COMMENT ON FUNCTION switchboard.events_since_v2(uuid, bigint, bigint, text[], bigint, integer) IS
    'What user_id missed after the position (after_tick, after_id) -- an event frame''s cursor -- through tick through_tick (NULL: the newest): its own events and events of the given rooms it belongs to, in delivery order (tick, then id). Exact under any commit order: every event after the position exactly once. after_id 9223372036854775807 = all of after_tick. Compare with event_window() for resume_gap.';
REVOKE ALL ON FUNCTION switchboard.events_since_v2(uuid, bigint, bigint, text[], bigint, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.events_since_v2(uuid, bigint, bigint, text[], bigint, integer) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.relay_read_v2(after_tick bigint, after_id bigint,
                                                     ephemeral_ids bigint[] DEFAULT '{}',
                                                     max_rows integer DEFAULT 1000)
RETURNS TABLE (tick bigint, id bigint, ephemeral boolean, user_id uuid, room text, event text, sender uuid,
               payload jsonb, ts bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_position(after_tick, after_id, max_rows);
    IF cardinality(ephemeral_ids) > 10000 THEN
        RAISE EXCEPTION 'too many ephemeral ids (%)', cardinality(ephemeral_ids) USING ERRCODE = '22023',
            HINT = 'At most 10000 per read.';
    END IF;
    RETURN QUERY
    SELECT a.tick, a.id, false, a.user_id, a.room, a.event, NULL::uuid, a.payload,
           (extract(epoch FROM a.created_at) * 1000)::bigint
      FROM switchboard._events_after(NULL, NULL, after_tick, after_id, NULL, max_rows) a;
    RETURN QUERY
    SELECT NULL::bigint, x.id, true, x.user_id, x.room, x.event, x.sender, x.payload,
           (extract(epoch FROM x.created_at) * 1000)::bigint
      FROM switchboard.ephemeral_events x
     WHERE x.id = ANY (coalesce(ephemeral_ids, '{}'))
       AND x.created_at > now() - interval '30 seconds'
     ORDER BY x.id;
END
$$;
COMMENT ON FUNCTION switchboard.relay_read_v2(bigint, bigint, bigint[], integer) IS
    'Internal (relay): stored events after the position (after_tick, after_id) in delivery order (tick, then id; at most max_rows), then the ephemeral events with the given ids (younger than 30 s). What a replica delivers; NOTIFY payloads only say when to call it.';
REVOKE ALL ON FUNCTION switchboard.relay_read_v2(bigint, bigint, bigint[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.relay_read_v2(bigint, bigint, bigint[], integer) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.event_window()
RETURNS TABLE (first_tick bigint, last_tick bigint, reaped_through bigint, publishers_notify boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT h.reaped_tick, coalesce((SELECT max(k.tick) FROM switchboard.event_ticks k), h.reaped_tick),
           h.reaped_through, (SELECT t.publishers_notify FROM switchboard.event_ticker t WHERE t.singleton)
      FROM switchboard.event_horizon h;
END
$$;
COMMENT ON FUNCTION switchboard.event_window()
    IS 'The retained stream: a position (tick, id) is complete iff tick > first_tick, or tick = first_tick with id 9223372036854775807 (all of it); anything older gets resume_gap. last_tick is the newest tick (a relay''s starting position is (last_tick, 9223372036854775807)); reaped_through the highest event id reaped; publishers_notify whether publishers NOTIFY (false: relays poll event_tick()).';
REVOKE ALL ON FUNCTION switchboard.event_window() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.event_window() TO switchboard_app;

-- A bare event id (the previous release's resume cursor) as a position: the
-- batch that made it visible. Exact for a client that processed frames in
-- delivery order: having seen event N it has seen everything before (batch(N), N).
CREATE OR REPLACE FUNCTION switchboard.event_batch(event_id bigint)
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT b.tick FROM switchboard.events e
             CROSS JOIN LATERAL (SELECT k.tick FROM switchboard.event_ticks k
                                  WHERE k.snap_xmax > e.xid AND pg_visible_in_snapshot(e.xid, k.snap)
                                  ORDER BY k.snap_xmax, k.tick LIMIT 1) b
             WHERE e.id = event_id);
END
$$;
COMMENT ON FUNCTION switchboard.event_batch(bigint) IS
    'The tick whose batch holds event event_id (its position is (tick, event_id)); NULL if the event is not retained or not in a tick yet.';
REVOKE ALL ON FUNCTION switchboard.event_batch(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.event_batch(bigint) TO switchboard_app;

-- Retention counts from when an event became visible (its tick), not from its
-- insert: an event whose transaction stayed open longer than the window is
-- still kept for a full window after it commits. The cut is the newest tick
-- older than keep: every event visible in its snapshot goes, older ticks go,
-- the cut itself stays as the first batch boundary (event_window().first_tick).
CREATE OR REPLACE FUNCTION switchboard.reap_events(keep interval DEFAULT '5 minutes')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer := 0;
    v_max bigint;
    v_cut bigint;
    v_snap pg_snapshot;
BEGIN
    IF keep IS NULL OR keep < interval '0' THEN
        RAISE EXCEPTION 'invalid keep interval "%"', keep USING ERRCODE = '22023',
            HINT = 'keep is the resume window, e.g. ''5 minutes''.';
    END IF;
    SELECT k.tick, k.snap INTO v_cut, v_snap
      FROM switchboard.event_ticks k WHERE k.created_at < now() - keep ORDER BY k.tick DESC LIMIT 1;
    IF v_cut IS NOT NULL AND v_cut > (SELECT h.reaped_tick FROM switchboard.event_horizon h) THEN
        WITH gone AS (
            DELETE FROM switchboard.events e
             WHERE e.xid < pg_snapshot_xmax(v_snap) AND pg_visible_in_snapshot(e.xid, v_snap)
            RETURNING e.id
        )
        SELECT count(*), max(id) INTO v_n, v_max FROM gone;
        DELETE FROM switchboard.event_ticks k WHERE k.tick < v_cut;
        UPDATE switchboard.event_horizon
           SET reaped_tick = v_cut, reaped_through = greatest(reaped_through, coalesce(v_max, 0));
    END IF;
    -- Ephemeral rows are only read within 30 s of their NOTIFY.
    DELETE FROM switchboard.ephemeral_events x WHERE x.created_at < now() - interval '1 minute';
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_events(interval) IS
    'Delete the events that became visible more than keep ago (the resume window, default 5 minutes, counted from the tick that made them visible, so a long transaction''s events get the full window after COMMIT) and the ticks before; advance event_window() / event_horizon(); drop ephemeral events older than a minute. Returns how many events.';
REVOKE ALL ON FUNCTION switchboard.reap_events(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_events(interval) TO switchboard_app;

-- Client events (typing) are published on the bus, tagged with the sender,
-- never stored in events, and have no id. The sender must belong to the
-- room; the function checks it. The event itself is a row of
-- ephemeral_events read by the relays (the NOTIFY is only its id), so a
-- forged NOTIFY cannot put words in a member's mouth.
CREATE OR REPLACE FUNCTION switchboard.publish_client_event(sender uuid, room text, event text, payload jsonb DEFAULT '{}')
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_event(event, payload, 4096);
    IF NOT EXISTS (SELECT 1 FROM switchboard.room_members m
                    WHERE m.room = publish_client_event.room AND m.user_id = sender) THEN
        RAISE EXCEPTION 'user % is not a member of room "%"', sender, room USING ERRCODE = '42501',
            HINT = 'Only room members may publish client events to a room.';
    END IF;
    PERFORM switchboard._publish_ephemeral(NULL, room, event, sender, payload);
END
$$;
COMMENT ON FUNCTION switchboard.publish_client_event(uuid, text, text, jsonb) IS
    'Relay an ephemeral client event (e.g. typing) from sender to a room it belongs to: never stored in events, no id, payload up to 4 kB. 42501 if sender is not a member.';
REVOKE ALL ON FUNCTION switchboard.publish_client_event(uuid, text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.publish_client_event(uuid, text, text, jsonb) TO switchboard_app;

-- One registration for both tool-call entry points (tool_call_send and the
-- previous release's tool_call_start): validate, refuse an offline user (NULL),
-- record who the call went to and which replica waits. The callers differ only
-- in how the browser hears of the call.
CREATE OR REPLACE FUNCTION switchboard._tool_call_register(
    user_id uuid, replica_id text, name text, args jsonb, timeout interval)
RETURNS uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id uuid := gen_random_uuid();
BEGIN
    PERFORM switchboard._check_event(coalesce(name, ''), coalesce(args, 'null'), 6000);
    IF timeout IS NULL OR timeout <= interval '0' OR timeout > interval '10 minutes' THEN
        RAISE EXCEPTION 'invalid timeout "%"', timeout USING ERRCODE = '22023',
            HINT = 'A tool call waits between 1 ms and 10 minutes.';
    END IF;
    IF NOT switchboard.user_online(user_id) THEN
        RETURN NULL;
    END IF;
    INSERT INTO switchboard.tool_calls (id, user_id, replica_id, name, expires_at)
    VALUES (v_id, user_id, replica_id, name, now() + timeout);
    RETURN v_id;
END
$$;
REVOKE ALL ON FUNCTION switchboard._tool_call_register(uuid, text, text, jsonb, interval) FROM PUBLIC;

-- The tool bridge's send and collect, replacing tool_call_start and
-- tool_call_take (db/functions/70_replicas.sql; kept for a previous-release
-- server during a rolling update). tool_call_start put the call's name and
-- args in the NOTIFY payload, so anybody could send a browser a forged
-- tool.call; here the call is an ephemeral row read by the relay. And a
-- forged tool_result wake-up made the waiter collect (and delete) an
-- unanswered call: tool_call_collect only takes an answered one.
CREATE OR REPLACE FUNCTION switchboard.tool_call_send(
    user_id uuid, replica_id text, name text, args jsonb DEFAULT '{}', timeout interval DEFAULT '30 seconds')
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id uuid;
BEGIN
    v_id := switchboard._tool_call_register(user_id, replica_id, name, args, timeout);
    IF v_id IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM switchboard._publish_ephemeral(user_id, NULL, 'tool.call.' || v_id, NULL,
                                           jsonb_build_object('name', name, 'args', args));
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION switchboard.tool_call_send(uuid, text, text, jsonb, interval) IS
    'Send tool.call.<id> to user_id''s sockets wherever they are; returns the call id, or NULL if the user has no socket on any live replica. The answer is collected with tool_call_collect().';
REVOKE ALL ON FUNCTION switchboard.tool_call_send(uuid, text, text, jsonb, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.tool_call_send(uuid, text, text, jsonb, interval) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.tool_call_collect(call_id uuid, give_up boolean DEFAULT false)
RETURNS TABLE (answered boolean, result jsonb)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    DELETE FROM switchboard.tool_calls c
     WHERE c.id = tool_call_collect.call_id AND (c.answered OR give_up)
    RETURNING c.answered, c.result;
END
$$;
COMMENT ON FUNCTION switchboard.tool_call_collect(uuid, boolean) IS
    'The waiting replica collects an answered tool call (no row while unanswered: a wake-up that was not an answer changes nothing). give_up => true forgets the call whatever its state (timeout).';
REVOKE ALL ON FUNCTION switchboard.tool_call_collect(uuid, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.tool_call_collect(uuid, boolean) TO switchboard_app;

-- db/functions/60_users.sql
-- Users, roles, tokens and rooms.
--
-- Passwords are hashed by the server (argon2/bcrypt: the hashing work scales
-- with replicas, not on the database); the database only stores the hash and
-- refuses anything that does not look like one. The application role cannot
-- SELECT password_hash (column grants); it reads a hash only through
-- login_lookup(). Changes that affect live sessions (role, disabled, logout,
-- room membership) are announced on channel switchboard_control at COMMIT so
-- every replica re-checks that user's sockets within a second.
--
-- An announcement is a hint naming ids only ({"kind": "user", "user_id"},
-- {"kind": "revoke", "jti"}, {"kind": "member", "room", "user_id"}): any role
-- that can connect may pg_notify on the channel, so a replica re-reads the
-- state itself (user_states, revoked_among, is_room_member) before acting.
-- A forged hint costs one read and changes nothing.
--
-- Token epochs: a role change, a password change and disabling a user bump
-- users.token_epoch; tokens carry the epoch they were issued in and a
-- replica refuses older ones, so those changes revoke every existing token.

-- Inlined into its callers like _wake_workers: no SET clause, qualified names.
CREATE OR REPLACE FUNCTION switchboard._announce(msg jsonb)
RETURNS void
LANGUAGE sql
AS $$ SELECT pg_catalog.pg_notify('switchboard_control', msg::pg_catalog.text) $$;
REVOKE ALL ON FUNCTION switchboard._announce(jsonb) FROM PUBLIC;

-- The identity of a username (issue 21): its NFKC normal form, ASCII
-- case-folded, so 'Alice' and 'ALICE' are one user. Stored names are ASCII
-- (users_username_check), so the ASCII branch needs no normalize() (which also
-- needs a UTF8 database). V0012 creates it first, for the unique index
-- users_username_folded_key; this copy is the definition (same text). The
-- server applies the same rule (bounded.fold_username) to its login throttle
-- bucket and device cookie.
CREATE OR REPLACE FUNCTION switchboard.fold_username(name text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$
    SELECT pg_catalog.lower(
        (CASE WHEN name OPERATOR(pg_catalog.~) '^[\x01-\x7f]*$' THEN name
              ELSE pg_catalog.normalize(name, 'NFKC') END) COLLATE "C")
$$;
COMMENT ON FUNCTION switchboard.fold_username(text) IS
    'The identity of a username: NFKC normal form, ASCII lower case. Unique over users (users_username_folded_key); login and find_user compare with it.';
REVOKE ALL ON FUNCTION switchboard.fold_username(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.fold_username(text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard._check_role(role text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF role IS NULL OR role NOT IN ('admin', 'member') THEN
        RAISE EXCEPTION 'invalid role "%"', role USING ERRCODE = '22023', HINT = 'A role is admin or member.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_role(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard._check_hash(password_hash text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF password_hash IS NULL OR password_hash !~ '^\$(argon2(id|i|d)|2[abxy]?)\$' THEN
        RAISE EXCEPTION 'password_hash is not an argon2 or bcrypt hash' USING ERRCODE = '22023',
            HINT = 'Hash passwords in the server (argon2id); never store a plain password.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_hash(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard.create_user(username text, password_hash text, role text DEFAULT 'member')
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_id uuid;
BEGIN
    IF username IS NULL OR username !~ '^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$' THEN
        RAISE EXCEPTION 'invalid username "%"', username USING ERRCODE = '22023',
            HINT = 'A username is 1 to 64 characters: letters, digits, _ . @ - (not starting with punctuation).';
    END IF;
    PERFORM switchboard._check_hash(password_hash);
    PERFORM switchboard._check_role(role);
    BEGIN
        INSERT INTO switchboard.users (username, password_hash, role)
        VALUES (username, password_hash, role) RETURNING id INTO v_id;
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'user "%" already exists', username USING ERRCODE = '23505';
    END;
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION switchboard.create_user(text, text, text) IS
    'Create a user with an argon2/bcrypt hash (hashed by the server) and a role (admin or member). Returns the id. 23505 if the name is taken, compared case-insensitively (fold_username).';
REVOKE ALL ON FUNCTION switchboard.create_user(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.create_user(text, text, text) TO switchboard_app;

-- Every lookup by name compares identities (switchboard.fold_username):
-- 'ALICE' finds alice, through the unique index users_username_folded_key.
CREATE OR REPLACE FUNCTION switchboard.find_user(username text)
RETURNS TABLE (id uuid, username text, role text, disabled boolean)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT u.id, u.username, u.role, u.disabled FROM switchboard.users u
       WHERE switchboard.fold_username(u.username) = switchboard.fold_username($1) $$;
COMMENT ON FUNCTION switchboard.find_user(text) IS 'Look a user up by name, compared case-insensitively after NFKC (fold_username; no password hash). No row if unknown.';
REVOKE ALL ON FUNCTION switchboard.find_user(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.find_user(text) TO switchboard_app;

-- PL/pgSQL rather than LANGUAGE sql: a SQL function with a SET clause is never
-- inlined and is re-planned on every call; PL/pgSQL caches its plan.
CREATE OR REPLACE FUNCTION switchboard.login_lookup(username text)
RETURNS TABLE (user_id uuid, password_hash text, role text, disabled boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT u.id, u.password_hash, u.role, u.disabled
                   FROM switchboard.users u
                  WHERE switchboard.fold_username(u.username) = switchboard.fold_username(login_lookup.username);
END
$$;
COMMENT ON FUNCTION switchboard.login_lookup(text) IS
    'The one way the application reads a password hash: for verifying a login. No row if the user is unknown.';
REVOKE ALL ON FUNCTION switchboard.login_lookup(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.login_lookup(text) TO switchboard_app;

-- login_lookup_v2 adds token_epoch (what the issued token carries as "gen").
-- Beside login_lookup, not instead of it: a previous-release server keeps
-- calling the old one during a rolling update (drop it a release later).
CREATE OR REPLACE FUNCTION switchboard.login_lookup_v2(username text)
RETURNS TABLE (user_id uuid, password_hash text, role text, disabled boolean, token_epoch integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT u.id, u.password_hash, u.role, u.disabled, u.token_epoch
                   FROM switchboard.users u
                  WHERE switchboard.fold_username(u.username) = switchboard.fold_username(login_lookup_v2.username);
END
$$;
COMMENT ON FUNCTION switchboard.login_lookup_v2(text) IS
    'login_lookup plus the user''s token_epoch, which the issued token carries (a role or password change, or disabling, moves it on and so revokes older tokens). No row if the user is unknown.';
REVOKE ALL ON FUNCTION switchboard.login_lookup_v2(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.login_lookup_v2(text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard._user_changed(user_id uuid)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v switchboard.users;
BEGIN
    SELECT * INTO v FROM switchboard.users u WHERE u.id = _user_changed.user_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user % does not exist', user_id USING ERRCODE = 'P0002';
    END IF;
    -- Ids only: replicas re-read role, disabled and token_epoch with user_states().
    PERFORM switchboard._announce(jsonb_build_object('kind', 'user', 'user_id', v.id));
END
$$;
REVOKE ALL ON FUNCTION switchboard._user_changed(uuid) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard.set_user_role(user_id uuid, role text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_old text;
BEGIN
    PERFORM switchboard._check_role(role);
    -- The old role, locked: whether this is a real change is decided on the row.
    SELECT u.role INTO v_old FROM switchboard.users u WHERE u.id = set_user_role.user_id FOR UPDATE;
    UPDATE switchboard.users u
       SET role = set_user_role.role, updated_at = now(),
           token_epoch = u.token_epoch + CASE WHEN u.role = set_user_role.role THEN 0 ELSE 1 END
     WHERE u.id = set_user_role.user_id;
    IF FOUND AND v_old IS DISTINCT FROM set_user_role.role THEN
        -- A real change: the sessions minted under the old role end too (V0011).
        PERFORM switchboard._end_user_sessions(user_id, 'role');
    END IF;
    PERFORM switchboard._user_changed(user_id);
END
$$;
COMMENT ON FUNCTION switchboard.set_user_role(uuid, text) IS
    'Change a user''s role (admin or member). A real change revokes the user''s existing tokens (token_epoch), ends its sessions and is announced at COMMIT: every replica closes the user''s sockets (1008) within a second.';
REVOKE ALL ON FUNCTION switchboard.set_user_role(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.set_user_role(uuid, text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.set_user_password_hash(user_id uuid, password_hash text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_hash(password_hash);
    UPDATE switchboard.users u SET password_hash = set_user_password_hash.password_hash, updated_at = now(),
           token_epoch = u.token_epoch + 1
     WHERE u.id = set_user_password_hash.user_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user % does not exist', user_id USING ERRCODE = 'P0002';
    END IF;
    -- A ticket minted with the old credentials must not open a socket after the change,
    -- and a refresh cookie must not outlive it (V0011).
    DELETE FROM switchboard.tickets t WHERE t.user_id = set_user_password_hash.user_id;
    PERFORM switchboard._end_user_sessions(user_id, 'password');
    PERFORM switchboard._user_changed(user_id);
END
$$;
COMMENT ON FUNCTION switchboard.set_user_password_hash(uuid, text) IS
    'Replace a user''s password hash (argon2/bcrypt, computed by the server). Revokes the user''s existing tokens, sessions (refresh tokens) and unused WebSocket tickets; every replica closes the user''s open sockets at COMMIT.';
REVOKE ALL ON FUNCTION switchboard.set_user_password_hash(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.set_user_password_hash(uuid, text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.disable_user(user_id uuid)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE switchboard.users u SET disabled = true, updated_at = now(), token_epoch = u.token_epoch + 1
     WHERE u.id = disable_user.user_id;
    DELETE FROM switchboard.tickets t WHERE t.user_id = disable_user.user_id;
    PERFORM switchboard._end_user_sessions(user_id, 'disabled');
    PERFORM switchboard._user_changed(user_id);
END
$$;
COMMENT ON FUNCTION switchboard.disable_user(uuid) IS
    'Disable a user: tickets are dropped, its sessions end, its tokens are revoked for good (enable_user does not revive them), and at COMMIT every replica closes the user''s sockets (within a second).';
REVOKE ALL ON FUNCTION switchboard.disable_user(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.disable_user(uuid) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.enable_user(user_id uuid)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE switchboard.users u SET disabled = false, updated_at = now() WHERE u.id = enable_user.user_id;
    PERFORM switchboard._user_changed(user_id);
END
$$;
COMMENT ON FUNCTION switchboard.enable_user(uuid) IS 'Re-enable a disabled user (announced like disable_user).';
REVOKE ALL ON FUNCTION switchboard.enable_user(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.enable_user(uuid) TO switchboard_app;

-- Logout: the token id is remembered until the token would expire anyway,
-- and announced so every replica refuses it at once.
CREATE OR REPLACE FUNCTION switchboard.revoke_token(jti text, user_id uuid, expires_at timestamptz)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF jti IS NULL OR length(jti) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'invalid token id "%"', jti USING ERRCODE = '22023';
    END IF;
    INSERT INTO switchboard.revoked_tokens (jti, user_id, expires_at)
    VALUES (jti, user_id, coalesce(expires_at, now() + interval '1 day'))
    ON CONFLICT ON CONSTRAINT revoked_tokens_pkey DO NOTHING;
    PERFORM switchboard._announce(jsonb_build_object('kind', 'revoke', 'jti', jti));
END
$$;
COMMENT ON FUNCTION switchboard.revoke_token(text, uuid, timestamptz) IS
    'Revoke an access token (logout) on every replica until it would have expired.';
REVOKE ALL ON FUNCTION switchboard.revoke_token(text, uuid, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.revoke_token(text, uuid, timestamptz) TO switchboard_app;

-- What a replica needs to (re)build its view of revoked tokens and changed
-- users after it (re)connects its LISTEN connection and may have missed
-- announcements. A user whose last change is older than the token lifetime
-- needs no entry: every token issued before that change has expired.
CREATE OR REPLACE FUNCTION switchboard.auth_snapshot(since interval DEFAULT '1 day')
RETURNS TABLE (kind text, id text, user_id uuid, role text, disabled boolean)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'revoke', r.jti, r.user_id, NULL::text, NULL::boolean
      FROM switchboard.revoked_tokens r WHERE r.expires_at > now()
    UNION ALL
    SELECT 'user', u.id::text, u.id, u.role, u.disabled
      FROM switchboard.users u WHERE u.disabled OR u.updated_at > now() - since
$$;
COMMENT ON FUNCTION switchboard.auth_snapshot(interval) IS
    'Revoked tokens still valid, and users disabled or changed within since: what a replica reloads after its LISTEN connection reconnects.';
REVOKE ALL ON FUNCTION switchboard.auth_snapshot(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.auth_snapshot(interval) TO switchboard_app;

-- auth_snapshot_v2 adds token_epoch; auth_snapshot stays for a previous-release
-- server during a rolling update.
CREATE OR REPLACE FUNCTION switchboard.auth_snapshot_v2(since interval DEFAULT '1 day')
RETURNS TABLE (kind text, id text, user_id uuid, role text, disabled boolean, token_epoch integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
-- PL/pgSQL (bound at first call, not at CREATE): the function files are also
-- applied on top of an older schema (pgmigrate -t N), before token_epoch exists.
BEGIN
    RETURN QUERY
    SELECT 'revoke'::text, r.jti, r.user_id, NULL::text, NULL::boolean, NULL::integer
      FROM switchboard.revoked_tokens r WHERE r.expires_at > now()
    UNION ALL
    SELECT 'user'::text, u.id::text, u.id, u.role, u.disabled, u.token_epoch
      FROM switchboard.users u WHERE u.disabled OR u.updated_at > now() - auth_snapshot_v2.since;
END
$$;
COMMENT ON FUNCTION switchboard.auth_snapshot_v2(interval) IS
    'auth_snapshot plus each user''s token_epoch: revoked tokens still valid, and users disabled or changed within since. What a replica reloads after its LISTEN connection reconnects.';
REVOKE ALL ON FUNCTION switchboard.auth_snapshot_v2(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.auth_snapshot_v2(interval) TO switchboard_app;

-- The replica's own read behind a "user" hint: batched (one call per LISTEN
-- wake-up for every user named since the last one). A user that does not
-- exist returns no row; the replica treats it as disabled.
CREATE OR REPLACE FUNCTION switchboard.user_states(user_ids uuid[])
RETURNS TABLE (user_id uuid, role text, disabled boolean, token_epoch integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(user_ids) > 10000 THEN
        RAISE EXCEPTION 'too many user ids (%)', cardinality(user_ids) USING ERRCODE = '22023',
            HINT = 'At most 10000 per call.';
    END IF;
    RETURN QUERY SELECT u.id, u.role, u.disabled, u.token_epoch
                   FROM switchboard.users u WHERE u.id = ANY (coalesce(user_ids, '{}'));
END
$$;
COMMENT ON FUNCTION switchboard.user_states(uuid[]) IS
    'Role, disabled flag and token epoch of the given users (no row for an unknown id): what a replica reads after a "user" announcement instead of trusting it.';
REVOKE ALL ON FUNCTION switchboard.user_states(uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.user_states(uuid[]) TO switchboard_app;

-- The replica's own read behind a "revoke" hint: which of these token ids are
-- really revoked (and until when).
CREATE OR REPLACE FUNCTION switchboard.revoked_among(jtis text[])
RETURNS TABLE (jti text, expires_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(jtis) > 10000 THEN
        RAISE EXCEPTION 'too many token ids (%)', cardinality(jtis) USING ERRCODE = '22023',
            HINT = 'At most 10000 per call.';
    END IF;
    RETURN QUERY SELECT r.jti, r.expires_at FROM switchboard.revoked_tokens r
                  WHERE r.jti = ANY (coalesce(jtis, '{}')) AND r.expires_at > now();
END
$$;
COMMENT ON FUNCTION switchboard.revoked_among(text[]) IS
    'The token ids among jtis that are revoked and not yet expired: what a replica reads after a "revoke" announcement.';
REVOKE ALL ON FUNCTION switchboard.revoked_among(text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.revoked_among(text[]) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.add_room_member(room text, user_id uuid)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF room IS NULL OR room !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' THEN
        RAISE EXCEPTION 'invalid room name "%"', room USING ERRCODE = '22023',
            HINT = 'A room name is 1 to 128 characters: letters, digits, _ . : -';
    END IF;
    IF user_id IS NULL OR NOT EXISTS (SELECT 1 FROM switchboard.users u WHERE u.id = add_room_member.user_id) THEN
        RAISE EXCEPTION 'user % does not exist', user_id USING ERRCODE = 'P0002';
    END IF;
    INSERT INTO switchboard.rooms (name) VALUES (room) ON CONFLICT ON CONSTRAINT rooms_pkey DO NOTHING;
    INSERT INTO switchboard.room_members (room, user_id) VALUES (room, user_id)
    ON CONFLICT ON CONSTRAINT room_members_pkey DO NOTHING;
    IF FOUND THEN
        PERFORM switchboard._announce(jsonb_build_object('kind', 'member', 'room', room, 'user_id', user_id));
        RETURN true;
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION switchboard.add_room_member(text, uuid) IS
    'Add user_id to room (the room is created on first member). True if added, false if already a member.';
REVOKE ALL ON FUNCTION switchboard.add_room_member(text, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.add_room_member(text, uuid) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.remove_room_member(room text, user_id uuid)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM switchboard.room_members m
     WHERE m.room = remove_room_member.room AND m.user_id = remove_room_member.user_id;
    IF FOUND THEN
        PERFORM switchboard._announce(jsonb_build_object('kind', 'member', 'room', room, 'user_id', user_id));
        RETURN true;
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION switchboard.remove_room_member(text, uuid) IS
    'Remove user_id from room; every replica drops the user''s sockets from the room stream. False if not a member.';
REVOKE ALL ON FUNCTION switchboard.remove_room_member(text, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.remove_room_member(text, uuid) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.is_room_member(room text, user_id uuid)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM switchboard.room_members m
                    WHERE m.room = is_room_member.room AND m.user_id = is_room_member.user_id);
END
$$;
COMMENT ON FUNCTION switchboard.is_room_member(text, uuid) IS 'True if user_id belongs to room.';
REVOKE ALL ON FUNCTION switchboard.is_room_member(text, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.is_room_member(text, uuid) TO switchboard_app;

-- db/functions/62_sessions.sql
-- Login sessions and rotating refresh tokens (V0011).
--
-- A session is one login; its refresh tokens are one family. The server
-- hands the refresh token to the browser in an HttpOnly cookie and never
-- stores it: only its SHA-256 is kept (like tickets). refresh_session() uses
-- the presented token up and issues the next one in the same transaction.
-- Presenting a token that was already used is the theft signal (RFC 9700
-- section 4.14.2, "refresh token rotation"): the whole family ends, so whichever of
-- the thief and the user holds the newer token loses it too.
--
-- Two tabs of one browser refreshing at the same instant send the same
-- cookie; the second would look like reuse. A token used less than
-- race_window ago is answered 'concurrent' instead (no new token, the family
-- stays): the browser already holds the newer cookie from the first answer
-- and simply retries. A replay after the window ends the family.
--
-- Ending a session is announced on switchboard_control as
-- {"kind": "session", "session_id"} (ids only, like every hint): each replica
-- re-reads it with session_states() and closes the sockets opened under it.
-- A password change, a role change and disable_user end all the user's
-- sessions too (60_users.sql); those already close sockets through the
-- user's token epoch, so they need no per-session announcement.

-- One place that ends a session: marks it, drops its unused tickets,
-- announces it. True if it was live.
CREATE OR REPLACE FUNCTION switchboard._end_session(session_id uuid, reason text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE switchboard.sessions s SET ended_at = now(), end_reason = _end_session.reason
     WHERE s.id = _end_session.session_id AND s.ended_at IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM switchboard.tickets t WHERE t.session_id = _end_session.session_id;
    PERFORM switchboard._announce(jsonb_build_object('kind', 'session', 'session_id', _end_session.session_id));
    RETURN true;
END
$$;
REVOKE ALL ON FUNCTION switchboard._end_session(uuid, text) FROM PUBLIC;

-- Every live session of a user (password change, role change, disable): one
-- UPDATE on the partial index sessions_user_live. No announcement: the
-- caller bumps the user's token epoch, which closes the sockets.
CREATE OR REPLACE FUNCTION switchboard._end_user_sessions(user_id uuid, reason text)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    UPDATE switchboard.sessions s SET ended_at = now(), end_reason = _end_user_sessions.reason
     WHERE s.user_id = _end_user_sessions.user_id AND s.ended_at IS NULL;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    DELETE FROM switchboard.tickets t WHERE t.user_id = _end_user_sessions.user_id AND t.session_id IS NOT NULL;
    RETURN v_n;
END
$$;
REVOKE ALL ON FUNCTION switchboard._end_user_sessions(uuid, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard._check_lifetime(lifetime interval)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF lifetime IS NULL OR lifetime < interval '1 second' OR lifetime > interval '365 days' THEN
        RAISE EXCEPTION 'invalid session lifetime "%"', lifetime USING ERRCODE = '22023',
            HINT = 'A session lives between 1 second and 365 days (SWITCHBOARD_SESSION_TTL).';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_lifetime(interval) FROM PUBLIC;

-- 256 random bits, hex: the refresh token. Stored only as sha256.
CREATE OR REPLACE FUNCTION switchboard.start_session(user_id uuid, lifetime interval)
RETURNS TABLE (session_id uuid, refresh_token text, expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_raw bytea := switchboard._random_128() || switchboard._random_128();
    v_disabled boolean;
    v_id uuid;
    v_exp timestamptz := now() + lifetime;
BEGIN
    PERFORM switchboard._check_lifetime(lifetime);
    SELECT u.disabled INTO v_disabled FROM switchboard.users u WHERE u.id = start_session.user_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user % does not exist', start_session.user_id USING ERRCODE = 'P0002';
    END IF;
    IF v_disabled THEN
        RAISE EXCEPTION 'user % is disabled', start_session.user_id USING ERRCODE = '28000',
            HINT = 'A disabled user cannot log in; see enable_user().';
    END IF;
    INSERT INTO switchboard.sessions (user_id, expires_at) VALUES (start_session.user_id, v_exp)
    RETURNING id INTO v_id;
    INSERT INTO switchboard.refresh_tokens (hash, session_id) VALUES (sha256(v_raw), v_id);
    RETURN QUERY SELECT v_id, encode(v_raw, 'hex'), v_exp;
END
$$;
COMMENT ON FUNCTION switchboard.start_session(uuid, interval) IS
    'Start a login session for user_id: its id, its first refresh token (64 hex characters, only the SHA-256 is stored) and when it expires unless refreshed (now() + lifetime). P0002 for an unknown user, 28000 for a disabled one.';
REVOKE ALL ON FUNCTION switchboard.start_session(uuid, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.start_session(uuid, interval) TO switchboard_app;

-- Returns an outcome instead of raising: a detected reuse must COMMIT the end
-- of the family (an exception would roll it back).
-- Exclusivity: the UPDATE ... WHERE used_at IS NULL decides; two refreshes
-- with one token serialise on its row and the second finds it used. A logout
-- racing a refresh serialise on the session row (FOR UPDATE).
CREATE OR REPLACE FUNCTION switchboard.refresh_session(refresh_token text, lifetime interval,
                                                       race_window interval DEFAULT '10 seconds')
RETURNS TABLE (outcome text, session_id uuid, user_id uuid, username text, role text, token_epoch integer,
               new_refresh_token text, expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_hash bytea;
    v_sid uuid;
    v_used timestamptz;
    v_s switchboard.sessions;
    v_u record;
    v_raw bytea;
    v_exp timestamptz;
BEGIN
    PERFORM switchboard._check_lifetime(lifetime);
    IF refresh_token IS NULL OR refresh_token !~ '^[0-9a-f]{64}$' THEN
        RETURN QUERY SELECT 'unknown'::text, NULL::uuid, NULL::uuid, NULL::text, NULL::text, NULL::integer,
                            NULL::text, NULL::timestamptz;
        RETURN;
    END IF;
    v_hash := sha256(decode(refresh_token, 'hex'));
    UPDATE switchboard.refresh_tokens t SET used_at = clock_timestamp()
     WHERE t.hash = v_hash AND t.used_at IS NULL
    RETURNING t.session_id INTO v_sid;
    IF NOT FOUND THEN
        SELECT t.session_id, t.used_at INTO v_sid, v_used FROM switchboard.refresh_tokens t WHERE t.hash = v_hash;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'unknown'::text, NULL::uuid, NULL::uuid, NULL::text, NULL::text, NULL::integer,
                                NULL::text, NULL::timestamptz;
            RETURN;
        END IF;
        SELECT * INTO v_s FROM switchboard.sessions s WHERE s.id = v_sid FOR UPDATE;
        IF v_s.ended_at IS NOT NULL THEN
            RETURN QUERY SELECT 'ended'::text, v_sid, v_s.user_id, NULL::text, NULL::text, NULL::integer,
                                NULL::text, NULL::timestamptz;
        ELSIF v_used > clock_timestamp() - coalesce(race_window, interval '0') THEN
            RETURN QUERY SELECT 'concurrent'::text, v_sid, v_s.user_id, NULL::text, NULL::text, NULL::integer,
                                NULL::text, NULL::timestamptz;
        ELSE
            PERFORM switchboard._end_session(v_sid, 'reuse');
            RETURN QUERY SELECT 'reused'::text, v_sid, v_s.user_id, NULL::text, NULL::text, NULL::integer,
                                NULL::text, NULL::timestamptz;
        END IF;
        RETURN;
    END IF;
    SELECT * INTO v_s FROM switchboard.sessions s WHERE s.id = v_sid FOR UPDATE;
    SELECT u.username, u.role, u.disabled, u.token_epoch INTO v_u FROM switchboard.users u WHERE u.id = v_s.user_id;
    IF v_s.ended_at IS NULL AND (v_u.disabled OR v_s.expires_at <= clock_timestamp()) THEN
        PERFORM switchboard._end_session(v_sid, CASE WHEN v_u.disabled THEN 'disabled' ELSE 'expired' END);
        v_s.ended_at := now();
    END IF;
    IF v_s.ended_at IS NOT NULL THEN
        RETURN QUERY SELECT 'ended'::text, v_sid, v_s.user_id, NULL::text, NULL::text, NULL::integer,
                            NULL::text, NULL::timestamptz;
        RETURN;
    END IF;
    v_raw := switchboard._random_128() || switchboard._random_128();
    v_exp := now() + lifetime;
    INSERT INTO switchboard.refresh_tokens (hash, session_id) VALUES (sha256(v_raw), v_sid);
    UPDATE switchboard.sessions s SET refreshed_at = now(), expires_at = v_exp WHERE s.id = v_sid;
    RETURN QUERY SELECT 'rotated'::text, v_sid, v_s.user_id, v_u.username::text, v_u.role::text,
                        v_u.token_epoch::integer, encode(v_raw, 'hex'), v_exp;
END
$$;
COMMENT ON FUNCTION switchboard.refresh_session(text, interval, interval) IS
    'Rotate a refresh token. outcome: rotated (new_refresh_token issued, the session''s expiry moved to now() + lifetime), unknown (no such token), ended (the session ended or expired), concurrent (the token was used less than race_window ago: retry with the newer one; nothing changed), reused (a used token came back: the whole session ended and was announced).';
REVOKE ALL ON FUNCTION switchboard.refresh_session(text, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.refresh_session(text, interval, interval) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.end_session(session_id uuid, reason text DEFAULT 'logout')
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF reason IS NULL OR reason NOT IN ('logout', 'revoked') THEN
        RAISE EXCEPTION 'invalid session end reason "%"', reason USING ERRCODE = '22023',
            HINT = 'end_session() takes logout or revoked; the other reasons are set by the functions that cause them.';
    END IF;
    RETURN switchboard._end_session(session_id, reason);
END
$$;
COMMENT ON FUNCTION switchboard.end_session(uuid, text) IS
    'End a session (logout, or an administrator''s revoke): its refresh tokens stop working, its unused tickets are dropped, and every replica closes the sockets opened under it (1008). False if it had already ended or does not exist.';
REVOKE ALL ON FUNCTION switchboard.end_session(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.end_session(uuid, text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.end_session_by_refresh(refresh_token text)
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_sid uuid;
BEGIN
    IF refresh_token IS NULL OR refresh_token !~ '^[0-9a-f]{64}$' THEN
        RETURN NULL;
    END IF;
    SELECT t.session_id INTO v_sid FROM switchboard.refresh_tokens t
     WHERE t.hash = sha256(decode(refresh_token, 'hex'));
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM switchboard._end_session(v_sid, 'logout');
    RETURN v_sid;
END
$$;
COMMENT ON FUNCTION switchboard.end_session_by_refresh(text) IS
    'Logout by refresh token (a client whose access token has expired): ends the token''s session. The session id, or NULL if the token is unknown.';
REVOKE ALL ON FUNCTION switchboard.end_session_by_refresh(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.end_session_by_refresh(text) TO switchboard_app;

-- The replica's own read behind a "session" hint, and its periodic check of
-- sockets whose session's known expiry has passed (it may have been refreshed
-- on another replica since).
CREATE OR REPLACE FUNCTION switchboard.session_states(session_ids uuid[])
RETURNS TABLE (session_id uuid, user_id uuid, expires_at timestamptz, ended_at timestamptz, end_reason text,
               live boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(session_ids) > 10000 THEN
        RAISE EXCEPTION 'too many session ids (%)', cardinality(session_ids) USING ERRCODE = '22023',
            HINT = 'At most 10000 per call.';
    END IF;
    RETURN QUERY SELECT s.id, s.user_id, s.expires_at, s.ended_at, s.end_reason,
                        s.ended_at IS NULL AND s.expires_at > clock_timestamp()
                   FROM switchboard.sessions s WHERE s.id = ANY (coalesce(session_ids, '{}'));
END
$$;
COMMENT ON FUNCTION switchboard.session_states(uuid[]) IS
    'Expiry and end of the given sessions (no row for an unknown id); live = not ended and not expired. What a replica reads after a "session" announcement instead of trusting it.';
REVOKE ALL ON FUNCTION switchboard.session_states(uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.session_states(uuid[]) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.reap_sessions(keep interval DEFAULT '1 day')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    -- Kept for `keep` after the end, so a late replay of an old token still
    -- reads as "ended" (401) rather than "unknown"; refresh_tokens cascade.
    DELETE FROM switchboard.sessions s
     WHERE s.expires_at < now() - keep OR s.ended_at < now() - keep;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_sessions(interval) IS
    'Delete sessions (and their refresh tokens) that ended or expired more than keep ago. Returns how many.';
REVOKE ALL ON FUNCTION switchboard.reap_sessions(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_sessions(interval) TO switchboard_app;

-- issue_ticket_v2 binds the ticket to the session it is minted under;
-- issue_ticket (the previous release's call) is a thin overload with no session.
CREATE OR REPLACE FUNCTION switchboard.issue_ticket_v2(user_id uuid, session_id uuid,
                                                       ttl interval DEFAULT '30 seconds')
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_raw bytea := switchboard._random_128();
    v_disabled boolean;
BEGIN
    IF ttl IS NULL OR ttl <= interval '0' OR ttl > interval '1 hour' THEN
        RAISE EXCEPTION 'invalid ticket ttl "%"', ttl USING ERRCODE = '22023',
            HINT = 'A ticket lives between 1 second and 1 hour; default 30 seconds.';
    END IF;
    SELECT u.disabled INTO v_disabled FROM switchboard.users u WHERE u.id = issue_ticket_v2.user_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user % does not exist', issue_ticket_v2.user_id USING ERRCODE = 'P0002';
    END IF;
    IF v_disabled THEN
        RAISE EXCEPTION 'user % is disabled', issue_ticket_v2.user_id USING ERRCODE = '28000',
            HINT = 'A disabled user cannot get a ticket; see enable_user().';
    END IF;
    IF issue_ticket_v2.session_id IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM switchboard.sessions s
             WHERE s.id = issue_ticket_v2.session_id AND s.user_id = issue_ticket_v2.user_id
               AND s.ended_at IS NULL AND s.expires_at > clock_timestamp()) THEN
        RAISE EXCEPTION 'session % has ended', issue_ticket_v2.session_id USING ERRCODE = '28000',
            HINT = 'Log in again (or refresh) for a live session.';
    END IF;
    INSERT INTO switchboard.tickets (hash, user_id, expires_at, session_id)
    VALUES (sha256(v_raw), issue_ticket_v2.user_id, now() + ttl, issue_ticket_v2.session_id);
    RETURN encode(v_raw, 'hex');
END
$$;
COMMENT ON FUNCTION switchboard.issue_ticket_v2(uuid, uuid, interval) IS
    'issue_ticket bound to a session: the socket it opens belongs to session_id (NULL: no session, a token from before sessions). 28000 if the session has ended or expired or is not the user''s.';
REVOKE ALL ON FUNCTION switchboard.issue_ticket_v2(uuid, uuid, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.issue_ticket_v2(uuid, uuid, interval) TO switchboard_app;

-- consume_ticket_v2 also returns the session (and its expiry, which the
-- socket watches); a ticket whose session ended meanwhile is refused.
CREATE OR REPLACE FUNCTION switchboard.consume_ticket_v2(ticket text)
RETURNS TABLE (user_id uuid, session_id uuid, session_expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_user uuid;
    v_sid uuid;
    v_expires timestamptz;
    v_sexp timestamptz;
BEGIN
    IF ticket IS NULL OR ticket !~ '^[0-9A-Fa-f]{32}$' THEN
        RETURN;
    END IF;
    DELETE FROM switchboard.tickets t WHERE t.hash = sha256(decode(lower(ticket), 'hex'))
    RETURNING t.user_id, t.expires_at, t.session_id INTO v_user, v_expires, v_sid;
    IF NOT FOUND OR v_expires <= clock_timestamp() THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM switchboard.users u WHERE u.id = v_user AND NOT u.disabled) THEN
        RETURN;
    END IF;
    IF v_sid IS NOT NULL THEN
        SELECT s.expires_at INTO v_sexp FROM switchboard.sessions s
         WHERE s.id = v_sid AND s.ended_at IS NULL AND s.expires_at > clock_timestamp();
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT v_user, v_sid, v_sexp;
END
$$;
COMMENT ON FUNCTION switchboard.consume_ticket_v2(text) IS
    'Consume a ticket exactly once: its user, session (NULL for a ticket from before sessions) and the session''s expiry; no row if the ticket is unknown, malformed, expired or used, its user is disabled, or its session has ended or expired.';
REVOKE ALL ON FUNCTION switchboard.consume_ticket_v2(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.consume_ticket_v2(text) TO switchboard_app;

-- auth_snapshot_v3 adds the sessions ended within since (kind 'session', id =
-- the session id): what a replica reloads after its LISTEN connection
-- reconnects. auth_snapshot_v2 stays for the previous release's server.
CREATE OR REPLACE FUNCTION switchboard.auth_snapshot_v3(since interval DEFAULT '1 day')
RETURNS TABLE (kind text, id text, user_id uuid, role text, disabled boolean, token_epoch integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT a.kind, a.id, a.user_id, a.role, a.disabled, a.token_epoch FROM switchboard.auth_snapshot_v2(since) a
    UNION ALL
    SELECT 'session'::text, s.id::text, s.user_id, NULL::text, NULL::boolean, NULL::integer
      FROM switchboard.sessions s WHERE s.ended_at > now() - auth_snapshot_v3.since;
END
$$;
COMMENT ON FUNCTION switchboard.auth_snapshot_v3(interval) IS
    'auth_snapshot_v2 plus the sessions ended within since (kind session): their access tokens are refused.';
REVOKE ALL ON FUNCTION switchboard.auth_snapshot_v3(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.auth_snapshot_v3(interval) TO switchboard_app;

-- db/functions/70_replicas.sql
-- Replica registry, presence and the tool bridge.
--
-- Each replica upserts its row every few seconds; presence rows hang off it
-- (ON DELETE CASCADE), so when a replica dies and reap_replicas() removes its
-- row, its users stop being "online" without anyone having to clean up.
--
-- Liveness: a replica is live while heartbeat_at > now() - live_window, where
-- live_window is a generated column derived from the replica's own
-- heartbeat_interval (V0002): greatest(30 s, 3 x interval). Every reader below
-- uses that column, so a replica configured to heartbeat every 60 s stays
-- live (and its users online) between heartbeats.

-- replica_heartbeat(id, info, handlers, heartbeat_interval, version): the
-- current servers' heartbeat. It records which task handlers the replica's
-- scheduler runs (an empty array for a replica with the scheduler off), so
-- known_handlers() and the switchboard.handlers view can tell which handlers
-- no live replica serves.
CREATE OR REPLACE FUNCTION switchboard.replica_heartbeat(
    replica_id text, info jsonb, handlers text[], heartbeat_interval interval, version text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF replica_id IS NULL OR length(replica_id) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'invalid replica id "%"', replica_id USING ERRCODE = '22023',
            HINT = 'A replica id is 1 to 200 characters, e.g. host:pid:random.';
    END IF;
    IF heartbeat_interval IS NULL OR heartbeat_interval <= interval '0' OR heartbeat_interval > interval '1 hour' THEN
        RAISE EXCEPTION 'invalid heartbeat interval "%"', heartbeat_interval USING ERRCODE = '22023',
            HINT = 'A replica heartbeats between every few milliseconds and every hour.';
    END IF;
    IF handlers IS NULL OR cardinality(handlers) > 10000 THEN
        RAISE EXCEPTION 'invalid handler list (% names)', cardinality(handlers) USING ERRCODE = '22023',
            HINT = 'Pass the handler names this replica runs, an empty array if none (at most 10000).';
    END IF;
    PERFORM switchboard._check_handler(h) FROM unnest(handlers) AS h;
    IF version IS NOT NULL AND length(version) NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'invalid version "%"', version USING ERRCODE = '22023',
            HINT = 'A version is 1 to 100 characters, e.g. 0.1.0.';
    END IF;
    INSERT INTO switchboard.replica_registry AS r (id, info, heartbeat_at, handlers, heartbeat_interval, version)
    VALUES (replica_id, coalesce(info, '{}'), now(), handlers, heartbeat_interval, version)
    ON CONFLICT ON CONSTRAINT replica_registry_pkey
    DO UPDATE SET heartbeat_at = now(), info = coalesce(EXCLUDED.info, r.info), handlers = EXCLUDED.handlers,
                  heartbeat_interval = EXCLUDED.heartbeat_interval, version = EXCLUDED.version;
END
$$;
COMMENT ON FUNCTION switchboard.replica_heartbeat(text, jsonb, text[], interval, text) IS
    'Register or refresh a replica with the task handlers it runs, its heartbeat interval (its liveness window is derived from it) and its server version.';
REVOKE ALL ON FUNCTION switchboard.replica_heartbeat(text, jsonb, text[], interval, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.replica_heartbeat(text, jsonb, text[], interval, text) TO switchboard_app;

-- The previous release's heartbeat (kept for a rolling update: drop it one
-- release later). Its replicas keep the default 5 s interval (30 s window,
-- as before) and register no handlers (NULL: "does not say").

CREATE OR REPLACE FUNCTION switchboard.replica_heartbeat(replica_id text, info jsonb DEFAULT '{}')
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF replica_id IS NULL OR length(replica_id) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'invalid replica id "%"', replica_id USING ERRCODE = '22023';
    END IF;
    INSERT INTO switchboard.replica_registry AS r (id, info, heartbeat_at)
    VALUES (replica_id, coalesce(info, '{}'), now())
    ON CONFLICT ON CONSTRAINT replica_registry_pkey
    DO UPDATE SET heartbeat_at = now(), info = coalesce(EXCLUDED.info, r.info);
END
$$;
COMMENT ON FUNCTION switchboard.replica_heartbeat(text, jsonb) IS
    'Register or refresh a replica (the previous release''s heartbeat; current servers call the five-argument form).';
REVOKE ALL ON FUNCTION switchboard.replica_heartbeat(text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.replica_heartbeat(text, jsonb) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.replica_stop(replica_id text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM switchboard.replica_registry r WHERE r.id = replica_id;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION switchboard.replica_stop(text) IS
    'Deregister a replica on clean shutdown (its presence rows go with it).';
REVOKE ALL ON FUNCTION switchboard.replica_stop(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.replica_stop(text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.reap_replicas(stale interval DEFAULT '30 seconds')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    DELETE FROM switchboard.replica_registry r WHERE r.heartbeat_at < now() - greatest(stale, r.live_window);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_replicas(interval) IS
    'Forget replicas that stopped heartbeating for longer than stale and their own liveness window (and their presence). Returns how many.';
REVOKE ALL ON FUNCTION switchboard.reap_replicas(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_replicas(interval) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.presence_set(replica_id text, user_id uuid, sockets integer)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF sockets IS NULL OR sockets < 0 THEN
        RAISE EXCEPTION 'invalid socket count %', sockets USING ERRCODE = '22023';
    END IF;
    IF sockets = 0 THEN
        DELETE FROM switchboard.presence_sockets p
         WHERE p.replica_id = presence_set.replica_id AND p.user_id = presence_set.user_id;
        RETURN;
    END IF;
    INSERT INTO switchboard.replica_registry (id) VALUES (replica_id)
    ON CONFLICT ON CONSTRAINT replica_registry_pkey DO NOTHING;
    INSERT INTO switchboard.presence_sockets AS p (replica_id, user_id, sockets)
    VALUES (replica_id, user_id, sockets)
    ON CONFLICT ON CONSTRAINT presence_sockets_pkey DO UPDATE SET sockets = EXCLUDED.sockets;
END
$$;
COMMENT ON FUNCTION switchboard.presence_set(text, uuid, integer) IS
    'Record how many sockets user_id has on replica_id (0 removes the row). Kept by each replica''s relay.';
REVOKE ALL ON FUNCTION switchboard.presence_set(text, uuid, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.presence_set(text, uuid, integer) TO switchboard_app;

CREATE OR REPLACE VIEW switchboard.replicas AS
    SELECT r.id, r.info, r.started_at, r.heartbeat_at,
           (SELECT coalesce(sum(p.sockets), 0) FROM switchboard.presence_sockets p WHERE p.replica_id = r.id) AS sockets,
           r.version, r.handlers, r.heartbeat_interval, r.live_window
      FROM switchboard.replica_registry r
     WHERE r.heartbeat_at > now() - r.live_window;
COMMENT ON VIEW switchboard.replicas IS 'Live replicas (heartbeat within their live_window), their open sockets, version and handlers.';
COMMENT ON COLUMN switchboard.replicas.id IS 'Replica id (host:pid:random); also its worker name on runs.';
COMMENT ON COLUMN switchboard.replicas.info IS 'Host, pid and sockets as of its last heartbeat.';
COMMENT ON COLUMN switchboard.replicas.started_at IS 'First heartbeat.';
COMMENT ON COLUMN switchboard.replicas.heartbeat_at IS 'Last heartbeat.';
COMMENT ON COLUMN switchboard.replicas.sockets IS 'Open WebSockets (from presence).';
COMMENT ON COLUMN switchboard.replicas.version IS 'Server version.';
COMMENT ON COLUMN switchboard.replicas.handlers IS 'Task handlers it runs.';
COMMENT ON COLUMN switchboard.replicas.heartbeat_interval IS 'How often it heartbeats.';
COMMENT ON COLUMN switchboard.replicas.live_window IS 'It counts as live while its last heartbeat is within this window.';
GRANT SELECT ON switchboard.replicas TO switchboard_app;

CREATE OR REPLACE VIEW switchboard.presence AS
    SELECT p.user_id, u.username, p.replica_id, p.sockets, p.since
      FROM switchboard.presence_sockets p
      JOIN switchboard.replica_registry r ON r.id = p.replica_id
      LEFT JOIN switchboard.users u ON u.id = p.user_id
     WHERE r.heartbeat_at > now() - r.live_window;
COMMENT ON VIEW switchboard.presence IS 'Which users have sockets on which live replica.';
COMMENT ON COLUMN switchboard.presence.user_id IS 'The user.';
COMMENT ON COLUMN switchboard.presence.username IS 'The user''s name.';
COMMENT ON COLUMN switchboard.presence.replica_id IS 'The live replica holding the sockets.';
COMMENT ON COLUMN switchboard.presence.sockets IS 'Open sockets of the user on that replica.';
COMMENT ON COLUMN switchboard.presence.since IS 'Since when.';
GRANT SELECT ON switchboard.presence TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.user_online(user_id uuid)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM switchboard.presence_sockets p
                     JOIN switchboard.replica_registry r ON r.id = p.replica_id
                    WHERE p.user_id = user_online.user_id AND p.sockets > 0
                      AND r.heartbeat_at > now() - r.live_window);
END
$$;
COMMENT ON FUNCTION switchboard.user_online(uuid) IS 'True if user_id has a socket on any live replica.';
REVOKE ALL ON FUNCTION switchboard.user_online(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.user_online(uuid) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.room_members_online(room text)
RETURNS TABLE (user_id uuid, username text, online boolean)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT m.user_id, u.username, switchboard.user_online(m.user_id)
      FROM switchboard.room_members m JOIN switchboard.users u ON u.id = m.user_id
     WHERE m.room = room_members_online.room
     ORDER BY u.username
$$;
COMMENT ON FUNCTION switchboard.room_members_online(text) IS 'Members of room with whether each has a socket anywhere now.';
REVOKE ALL ON FUNCTION switchboard.room_members_online(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.room_members_online(text) TO switchboard_app;

-- Handlers: which task handlers the live replicas run. known_handlers() is
-- what POST /tasks checks (create_task itself stays permissive: a DBA may
-- create a task for a handler that arrives with the next release). The view
-- puts what is served beside what is wanted (active tasks, queued or running
-- runs), so a DBA sees at a glance a handler nobody will run.
CREATE OR REPLACE FUNCTION switchboard.known_handlers(version text DEFAULT NULL)
RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT DISTINCT h
      FROM switchboard.replica_registry r CROSS JOIN LATERAL unnest(r.handlers) AS h
     WHERE r.heartbeat_at > now() - r.live_window
       AND (known_handlers.version IS NULL OR r.version = known_handlers.version)
     ORDER BY 1
$$;
COMMENT ON FUNCTION switchboard.known_handlers(text) IS
    'Task handler names that some live replica (of the given server version, or any when NULL) registers with its heartbeat.';
REVOKE ALL ON FUNCTION switchboard.known_handlers(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.known_handlers(text) TO switchboard_app;

CREATE OR REPLACE VIEW switchboard.handlers AS
    WITH served AS (
        SELECT h AS handler, count(*) AS live_replicas,
               array_agg(DISTINCT r.version ORDER BY r.version) FILTER (WHERE r.version IS NOT NULL) AS versions
          FROM switchboard.replica_registry r CROSS JOIN LATERAL unnest(r.handlers) AS h
         WHERE r.heartbeat_at > now() - r.live_window
         GROUP BY h
    ), wanted AS (
        SELECT w.handler, sum(w.tasks)::bigint AS active_tasks, sum(w.runs)::bigint AS pending_runs
          FROM (SELECT t.handler, count(*) AS tasks, 0 AS runs FROM switchboard.tasks t
                 WHERE t.is_active GROUP BY t.handler
                UNION ALL
                SELECT r.handler, 0, count(*) FROM switchboard.task_runs r
                 WHERE r.status IN ('queued', 'running') GROUP BY r.handler) AS w
         GROUP BY w.handler
    )
    SELECT coalesce(s.handler, w.handler, p.handler) AS handler,
           s.handler IS NOT NULL AS served,
           coalesce(s.live_replicas, 0) AS live_replicas,
           coalesce(s.versions, '{}') AS versions,
           coalesce(w.active_tasks, 0) AS active_tasks,
           coalesce(w.pending_runs, 0) AS pending_runs,
           p.handler IS NOT NULL AS paused,
           p.paused_at
      FROM served s FULL JOIN wanted w ON w.handler = s.handler
      FULL JOIN switchboard.paused_handlers p ON p.handler = coalesce(s.handler, w.handler);
COMMENT ON VIEW switchboard.handlers IS
    'Task handlers served by live replicas, wanted by active tasks or queued/running runs, or paused; served = false means no live replica runs it, paused = true that claims skip its work (pause_handler()).';
COMMENT ON COLUMN switchboard.handlers.handler IS 'Handler name.';
COMMENT ON COLUMN switchboard.handlers.served IS 'Some live replica runs it.';
COMMENT ON COLUMN switchboard.handlers.live_replicas IS 'How many live replicas run it.';
COMMENT ON COLUMN switchboard.handlers.versions IS 'Server versions of those replicas.';
COMMENT ON COLUMN switchboard.handlers.active_tasks IS 'Active tasks with this handler.';
COMMENT ON COLUMN switchboard.handlers.pending_runs IS 'Queued or running runs with this handler.';
COMMENT ON COLUMN switchboard.handlers.paused IS 'Paused by pause_handler(): claims skip its queued runs and due ticks.';
COMMENT ON COLUMN switchboard.handlers.paused_at IS 'When it was paused.';
GRANT SELECT ON switchboard.handlers TO switchboard_app;

-- Tool bridge. tool_call_start registers the call (who it went to, which
-- replica waits) and sends tool.call.<id> to the user's sockets as an
-- ephemeral event; tool_call_answer accepts the answer only from that user,
-- only once, and wakes the waiting replica on switchboard_control.
CREATE OR REPLACE FUNCTION switchboard.tool_call_start(
    user_id uuid, replica_id text, name text, args jsonb DEFAULT '{}', timeout interval DEFAULT '30 seconds')
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id uuid;
BEGIN
    v_id := switchboard._tool_call_register(user_id, replica_id, name, args, timeout);
    IF v_id IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('switchboard_events',
        json_build_object('id', NULL, 'user_id', user_id, 'room', NULL, 'event', 'tool.call.' || v_id,
                          'ts', (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
                          'ephemeral', true, 'payload', json_build_object('name', name, 'args', args))::text);
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION switchboard.tool_call_start(uuid, text, text, jsonb, interval) IS
    'Send tool.call.<id> to user_id''s sockets wherever they are; returns the call id, or NULL if the user has no socket on any live replica.';
REVOKE ALL ON FUNCTION switchboard.tool_call_start(uuid, text, text, jsonb, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.tool_call_start(uuid, text, text, jsonb, interval) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.tool_call_answer(call_id uuid, sender uuid, result jsonb)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_replica text;
BEGIN
    PERFORM switchboard._check_event('tool.result', coalesce(result, 'null'), 1048576);
    UPDATE switchboard.tool_calls c SET answered = true, result = tool_call_answer.result
     WHERE c.id = call_id AND c.user_id = sender AND NOT c.answered AND c.expires_at > now()
    RETURNING c.replica_id INTO v_replica;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM switchboard._announce(jsonb_build_object('kind', 'tool_result', 'call_id', call_id, 'replica_id', v_replica));
    RETURN true;
END
$$;
COMMENT ON FUNCTION switchboard.tool_call_answer(uuid, uuid, jsonb) IS
    'Answer a tool call. Accepted only from the user the call went to, only once, before it expires; wakes the waiting replica.';
REVOKE ALL ON FUNCTION switchboard.tool_call_answer(uuid, uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.tool_call_answer(uuid, uuid, jsonb) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.tool_call_take(call_id uuid)
RETURNS TABLE (answered boolean, result jsonb)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    DELETE FROM switchboard.tool_calls c WHERE c.id = call_id RETURNING c.answered, c.result;
END
$$;
COMMENT ON FUNCTION switchboard.tool_call_take(uuid) IS
    'The waiting replica collects (and forgets) a tool call: whether it was answered, and the result.';
REVOKE ALL ON FUNCTION switchboard.tool_call_take(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.tool_call_take(uuid) TO switchboard_app;

-- db/functions/75_presence_sync.sql
-- presence_sync: a replica's heartbeat re-asserts its whole presence in one
-- call (after a Postgres crash the UNLOGGED presence rows are gone; after a
-- missed presence_set the counts would drift). Replaces the replica's rows.
--
-- Set-based since V0013. The old body deleted with
-- "user_id <> ALL (user_ids)", a linear search of the array per row: S rows
-- times S elements, 400 million comparisons (seconds of a core) at 20,000
-- sockets, every heartbeat. Now both statements are joins the planner runs as
-- hash joins, and rows whose count did not change are not written at all (an
-- unchanged heartbeat writes nothing but the registry row). The statements are
-- planned with the actual array (plan_cache_mode = force_custom_plan): a
-- generic plan would guess 10 elements for unnest() and could pick a nested
-- loop, which is the quadratic plan again. Planning costs tens of microseconds,
-- once per heartbeat.
--
-- Duplicated user ids still raise 21000 (as before); a user listed with 0
-- sockets has no row afterwards (before V0013 an old row of that user stayed).
CREATE OR REPLACE FUNCTION switchboard.presence_sync(replica_id text, user_ids uuid[], sockets integer[])
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_variable
DECLARE
    v_rid text := presence_sync.replica_id;
    v_users uuid[] := coalesce(presence_sync.user_ids, '{}');
    v_socks integer[] := coalesce(presence_sync.sockets, '{}');
BEGIN
    IF cardinality(v_users) <> cardinality(v_socks) THEN
        RAISE EXCEPTION 'user_ids and sockets differ in length (% and %)', cardinality(v_users), cardinality(v_socks)
            USING ERRCODE = '22023', HINT = 'Pass one socket count per user id.';
    END IF;
    INSERT INTO switchboard.replica_registry (id) VALUES (v_rid)
    ON CONFLICT ON CONSTRAINT replica_registry_pkey DO UPDATE SET heartbeat_at = now();
    -- Rows of this replica whose user is gone (or listed with no socket).
    DELETE FROM switchboard.presence_sockets p
     WHERE p.replica_id = v_rid
       AND NOT EXISTS (SELECT 1 FROM unnest(v_users, v_socks) AS x(u, s) WHERE x.u = p.user_id AND x.s > 0);
    -- New users and changed counts only.
    INSERT INTO switchboard.presence_sockets AS p (replica_id, user_id, sockets)
    SELECT v_rid, x.u, x.s
      FROM unnest(v_users, v_socks) AS x(u, s)
      LEFT JOIN switchboard.presence_sockets o ON o.replica_id = v_rid AND o.user_id = x.u
     WHERE x.s > 0 AND (o.user_id IS NULL OR o.sockets <> x.s)
    ON CONFLICT ON CONSTRAINT presence_sockets_pkey DO UPDATE SET sockets = EXCLUDED.sockets;
END
$$;
COMMENT ON FUNCTION switchboard.presence_sync(text, uuid[], integer[]) IS
    'Replace all presence rows of replica_id with the given users and socket counts (called with each heartbeat). Set-based: rows whose count did not change are not written; a user with 0 sockets has no row afterwards.';
REVOKE ALL ON FUNCTION switchboard.presence_sync(text, uuid[], integer[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.presence_sync(text, uuid[], integer[]) TO switchboard_app;

-- db/functions/80_status.sql
-- One look for a DBA, and the maintenance sweep.

-- The WAL timeline this server writes on: PostgreSQL starts a new one at every
-- promotion (a failover or switchover) and, under Patroni, when a crashed primary
-- is restarted in place. Read from the current WAL file name, which needs no
-- privilege (pg_control_checkpoint() does, and lags until the next checkpoint).
-- NULL on a standby.
CREATE OR REPLACE FUNCTION switchboard._timeline()
RETURNS integer
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN pg_is_in_recovery() THEN NULL
                ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer END
$$;
REVOKE ALL ON FUNCTION switchboard._timeline() FROM PUBLIC;

-- PL/pgSQL, so the table is looked up when called, not when the function is
-- created: function files are also applied on top of older versions (pgmigrate
-- -t N), where V0006's table does not exist yet.
CREATE OR REPLACE FUNCTION switchboard._unlogged_since()
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT e.since FROM switchboard.unlogged_epoch e);
END
$$;
REVOKE ALL ON FUNCTION switchboard._unlogged_since() FROM PUBLIC;

-- Which PostgreSQL a replica is talking to, and whether the UNLOGGED state it
-- relied on survived. Called by every replica each time its LISTEN connection
-- (re)connects: a new timeline means a promotion happened (the replica counts
-- a failover); a new unlogged_since means tickets, rate buckets, registry,
-- presence and tool calls were emptied (crash recovery or promotion), so the
-- replica re-registers at once and fails its waiting tool calls instead of
-- letting them time out. The marker row is (re)created here: INSERT ... ON
-- CONFLICT DO NOTHING, so concurrent callers agree on one "since".
CREATE OR REPLACE FUNCTION switchboard.db_instance()
RETURNS TABLE (timeline integer, in_recovery boolean, started_at timestamptz, unlogged_since timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT pg_is_in_recovery() THEN
        INSERT INTO switchboard.unlogged_epoch (singleton) VALUES (true) ON CONFLICT DO NOTHING;
    END IF;
    RETURN QUERY SELECT switchboard._timeline(), pg_is_in_recovery(), pg_postmaster_start_time(),
                        switchboard._unlogged_since();
END
$$;
COMMENT ON FUNCTION switchboard.db_instance() IS
    'The server a replica is connected to: WAL timeline (+1 at every promotion), in_recovery, postmaster start, and since when the UNLOGGED state (tickets, rate buckets, registry, presence, tool calls) exists. A change of unlogged_since means that state was emptied by crash recovery or a promotion.';
REVOKE ALL ON FUNCTION switchboard.db_instance() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.db_instance() TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.status()
RETURNS TABLE (item text, value bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'tasks_due', count(*) FROM switchboard.tasks WHERE is_active AND next_run_at <= now()
    UNION ALL SELECT 'tasks_active', count(*) FROM switchboard.tasks WHERE is_active
    UNION ALL SELECT 'tasks_broken', switchboard._tasks_broken()
    UNION ALL SELECT 'runs_' || s, (SELECT count(*) FROM switchboard.task_runs r WHERE r.status = s)
      FROM unnest(ARRAY['queued', 'running', 'succeeded', 'failed', 'abandoned', 'cancelled']) AS s
    UNION ALL SELECT 'runs_due', count(*) FROM switchboard.task_runs WHERE status = 'queued' AND run_at <= now()
    UNION ALL SELECT 'expired_leases', count(*) FROM switchboard.task_runs
               WHERE status = 'running' AND lease_expires_at < now()
    UNION ALL SELECT 'live_tickets', count(*) FROM switchboard.tickets WHERE expires_at > now()
    UNION ALL SELECT 'rate_limit_keys', count(*) FROM switchboard.rate_limits
    UNION ALL SELECT 'events_retained', count(*) FROM switchboard.events
    UNION ALL SELECT 'event_backlog_seconds',
                     coalesce(extract(epoch FROM now() - min(created_at))::bigint, 0) FROM switchboard.events
    UNION ALL SELECT 'last_event_id', coalesce(max(id), 0) FROM switchboard.events
    UNION ALL SELECT 'live_replicas', count(*) FROM switchboard.replicas
    UNION ALL SELECT 'users_online', count(DISTINCT user_id) FROM switchboard.presence
    UNION ALL SELECT 'sockets_open', coalesce(sum(sockets), 0)::bigint FROM switchboard.presence
    UNION ALL SELECT 'handlers_unserved', count(*) FROM switchboard.handlers
               WHERE NOT served AND (active_tasks > 0 OR pending_runs > 0)
    UNION ALL SELECT 'handlers_paused', switchboard._handlers_paused()
    UNION ALL SELECT 'db_in_recovery', pg_is_in_recovery()::int
    UNION ALL SELECT 'db_timeline', switchboard._timeline()
    UNION ALL SELECT 'db_started_at', extract(epoch FROM pg_postmaster_start_time())::bigint
    UNION ALL SELECT 'unlogged_state_since', extract(epoch FROM switchboard._unlogged_since())::bigint
$$;
COMMENT ON FUNCTION switchboard.status() IS
    'One look at the system: due tasks, broken tasks (next fire time not computable: see tasks.last_error), runs by status (runs_cancelled apart from runs_failed), expired leases, live tickets, rate-limit keys, event backlog, live replicas, sockets, handlers that active tasks or pending runs need but no live replica serves (see the switchboard.handlers view), handlers paused by pause_handler(); and the server itself: db_in_recovery (0/1), db_timeline (goes up by one at every promotion), db_started_at and unlogged_state_since (epoch seconds; the latter moves when crash recovery or a promotion emptied the UNLOGGED tables).';
REVOKE ALL ON FUNCTION switchboard.status() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.status() TO switchboard_app;

-- The maintenance sweep, run by the default task 'switchboard.maintenance'
-- (handler 'maintenance') on one replica per tick. Each reaper is bounded by
-- its own index; the whole sweep is one transaction.
CREATE OR REPLACE FUNCTION switchboard.maintenance(
    keep_runs interval DEFAULT '7 days', keep_events interval DEFAULT '5 minutes',
    rate_limit_idle interval DEFAULT '1 hour', replica_stale interval DEFAULT '30 seconds')
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v jsonb := '{}';
    v_n integer;
BEGIN
    v := v || jsonb_build_object('expired_runs', switchboard.reap_expired_runs());
    v := v || jsonb_build_object('runs', switchboard.reap_runs(keep_runs));
    v := v || jsonb_build_object('tickets', switchboard.reap_tickets());
    v := v || jsonb_build_object('sessions', switchboard.reap_sessions());
    v := v || jsonb_build_object('rate_limits', switchboard.reap_rate_limits(rate_limit_idle));
    v := v || jsonb_build_object('events', switchboard.reap_events(keep_events));
    v := v || jsonb_build_object('replicas', switchboard.reap_replicas(replica_stale));
    DELETE FROM switchboard.revoked_tokens WHERE expires_at < now();
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v := v || jsonb_build_object('revoked_tokens', v_n);
    DELETE FROM switchboard.tool_calls WHERE expires_at < now() - interval '1 minute';
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v := v || jsonb_build_object('tool_calls', v_n);
    RETURN v;
END
$$;
COMMENT ON FUNCTION switchboard.maintenance(interval, interval, interval, interval) IS
    'Run every reaper once (expired leases, old runs, tickets, sessions ended a day ago, idle rate-limit keys, old events, dead replicas, expired revocations, stale tool calls). Returns counts per reaper.';
REVOKE ALL ON FUNCTION switchboard.maintenance(interval, interval, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.maintenance(interval, interval, interval, interval) TO switchboard_app;

-- db/functions/82_metrics.sql
-- What the Prometheus gauges and alerts read, cheap enough to call from every
-- replica every few seconds. status() is the DBA's full picture and counts
-- every run kept for a week; this reads only index-backed edges:
-- task_runs_running (expired leases), task_runs_queued (due runs and the oldest
-- due run_at), events_created (the oldest stored event), replicas (a few rows).
-- Ages are seconds on the database clock, so replica clock skew does not enter.
CREATE OR REPLACE FUNCTION switchboard.metrics_snapshot()
RETURNS TABLE (item text, value double precision)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'expired_leases', count(*)::double precision FROM switchboard.task_runs
     WHERE status = 'running' AND lease_expires_at IS NOT NULL AND lease_expires_at < now()
    UNION ALL SELECT 'runs_due', count(*)::double precision FROM switchboard.task_runs
     WHERE status = 'queued' AND run_at <= now()
    UNION ALL SELECT 'runs_due_age_seconds',
                     coalesce(extract(epoch FROM now() - min(run_at)), 0)::double precision
      FROM switchboard.task_runs WHERE status = 'queued' AND run_at <= now()
    UNION ALL SELECT 'event_backlog_seconds',
                     coalesce(extract(epoch FROM now() - min(created_at)), 0)::double precision
      FROM switchboard.events
    UNION ALL SELECT 'live_replicas', count(*)::double precision FROM switchboard.replicas
$$;
COMMENT ON FUNCTION switchboard.metrics_snapshot() IS
    'The gauges every replica exports on /metrics: expired_leases, runs_due, runs_due_age_seconds (oldest due queued run), event_backlog_seconds (oldest stored event), live_replicas. Index-backed; cheap to poll.';
REVOKE ALL ON FUNCTION switchboard.metrics_snapshot() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.metrics_snapshot() TO switchboard_app;

-- db/functions/85_job_sql.sql
-- The `sql` task handler: an admin's statement runs as switchboard_job.
--
-- SET [LOCAL] ROLE on the application's connection is not a security
-- boundary: any statement can RESET ROLE (e.g. EXECUTE 'RESET ROLE' inside a
-- DO block) and act with the application role again. A SECURITY DEFINER
-- function *owned by* switchboard_job is a boundary: while it runs, Postgres
-- refuses SET ROLE, RESET ROLE and SET SESSION AUTHORIZATION (42501), so the
-- statement cannot leave the job role, and the job role has no rights on
-- Switchboard's tables. search_path is pinned: statements schema-qualify
-- their tables (public.sessions, not sessions).
--
-- Ownership: the migrating role becomes a member of switchboard_job (so it
-- may transfer the function and re-create it on the next release), and the
-- job role holds CREATE on the schema only for the ALTER ... OWNER below.
--
-- Session state: whatever the statement leaves in the session (SET or
-- set_config(..., false), a session advisory lock, LISTEN, PREPARE, a temp
-- table) outlives this call. The server therefore runs each job on its own
-- connection and closes it afterwards (never a pooled one); a DBA calling
-- this from psql owns the session it runs in. The server also refuses a
-- task's timeout_seconds of 0 (no timeout) unless its operator allowed it
-- (SWITCHBOARD_SQL_ALLOW_NO_TIMEOUT).

-- Roles are cluster-wide (the two names are spelled only here and in
-- V0001__core_schema.sql and the GRANTs of db/functions). Two Switchboard
-- databases on one cluster would share switchboard_app: the login of one
-- deployment could act as the application in the other. Refuse to install
-- into a second database unless the operator opts in on the migrating
-- session (PGOPTIONS='-c switchboard.shared_roles=on'), e.g. for tests or
-- throwaway copies that trust each other. pg_shdepend is the cluster-wide
-- record of which database holds grants to (or objects of) a role; a
-- database cloned with CREATE DATABASE ... TEMPLATE copies its entries.
DO $shared_roles$
DECLARE
    v_other text;
BEGIN
    IF coalesce(current_setting('switchboard.shared_roles', true), '') IN ('on', 'true', '1') THEN
        RETURN;
    END IF;
    SELECT string_agg(DISTINCT d.datname, ', ' ORDER BY d.datname) INTO v_other
      FROM pg_catalog.pg_shdepend s
      JOIN pg_catalog.pg_database d ON d.oid = s.dbid
     WHERE s.refclassid = 'pg_catalog.pg_authid'::pg_catalog.regclass
       AND s.refobjid IN (SELECT r.oid FROM pg_catalog.pg_roles r
                           WHERE r.rolname IN ('switchboard_app', 'switchboard_job'))
       AND d.datname <> current_database();
    IF v_other IS NOT NULL THEN
        RAISE EXCEPTION 'roles switchboard_app and switchboard_job already hold privileges in database(s) %', v_other
            USING ERRCODE = '55000',
                  DETAIL = 'Roles are cluster-wide: a login granted switchboard_app for this database could act as the application in the other one too.',
                  HINT = 'Install each Switchboard in its own cluster, or drop the other installation. If the databases trust each other '
                      || '(tests, throwaway copies), migrate with PGOPTIONS=''-c switchboard.shared_roles=on''.';
    END IF;
END
$shared_roles$;

GRANT switchboard_job TO CURRENT_USER;
GRANT CREATE ON SCHEMA switchboard TO switchboard_job;

CREATE OR REPLACE FUNCTION switchboard.run_job_sql(statement text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_rows bigint;
BEGIN
    IF statement IS NULL OR length(btrim(statement)) = 0 THEN
        RAISE EXCEPTION 'the sql handler needs a statement' USING ERRCODE = '22023',
            HINT = 'Task args: {"sql": "DELETE FROM public.sessions WHERE expires_at < now()"}';
    END IF;
    EXECUTE statement;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN jsonb_build_object('rowcount', v_rows, 'role', current_user);
END
$$;
ALTER FUNCTION switchboard.run_job_sql(text) OWNER TO switchboard_job;
REVOKE CREATE ON SCHEMA switchboard FROM switchboard_job;
COMMENT ON FUNCTION switchboard.run_job_sql(text) IS
    'Run one SQL statement as the restricted role switchboard_job (the sql task handler). The statement cannot switch roles; it must schema-qualify table names. Session state it leaves behind stays with the session: run it on a connection that is closed afterwards. Returns {"rowcount", "role"}.';
REVOKE ALL ON FUNCTION switchboard.run_job_sql(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.run_job_sql(text) TO switchboard_app;

-- A sql task's statement can outlive statement_timeout: PL/pgSQL may catch
-- query_canceled and go on, and a closed client connection is noticed only
-- where client_connection_check_interval (which the statement may SET to 0)
-- is checked. So the replica terminates the job's backend after timeout +
-- grace, through these two functions, which make that power narrow:
--   * sql_job_register(run_id, kill_after) is called by the job's backend
--     itself (it registers pg_backend_pid(), nothing else), only while run_id
--     is a running run of the sql handler; it also ends orphans: a registered
--     backend of an earlier attempt of the same run (its replica stopped while
--     the statement ignored everything), or one past its kill_after;
--   * terminate_sql_job(pid) terminates only a backend registered that way,
--     still the same backend (pid and backend_start), after its kill_after.
-- The application role cannot terminate anything else through them, and the
-- job role (switchboard_job, what the statement runs as) can call neither.
-- PL/pgSQL, bound at first call: the file is also applied on top of an older
-- schema (pgmigrate -t N) that has no sql_job_backends yet.
CREATE OR REPLACE FUNCTION switchboard.sql_job_register(run_id bigint, kill_after interval)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_start timestamptz;
    v_orphan integer;
BEGIN
    IF kill_after IS NULL OR kill_after < interval '0' OR kill_after > interval '2 days' THEN
        RAISE EXCEPTION 'invalid kill_after "%"', kill_after USING ERRCODE = '22023',
            HINT = 'The statement''s timeout plus a grace period, between 0 and 2 days.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM switchboard.task_runs r
                    WHERE r.id = sql_job_register.run_id AND r.status = 'running' AND r.handler = 'sql') THEN
        RAISE EXCEPTION 'run % is not a running sql task run', run_id USING ERRCODE = '22023',
            HINT = 'Only the backend of a running sql task registers itself, just before its statement.';
    END IF;
    SELECT a.backend_start INTO v_start FROM pg_catalog.pg_stat_activity a WHERE a.pid = pg_catalog.pg_backend_pid();
    IF v_start IS NULL THEN
        RAISE EXCEPTION 'the owner of switchboard.sql_job_register cannot see this backend''s start time'
            USING ERRCODE = '42501',
                  HINT = 'GRANT pg_signal_backend, pg_read_all_stats TO the role that runs the migrations.';
    END IF;
    -- Rows of backends that are gone (ended normally, or terminated) go first.
    DELETE FROM switchboard.sql_job_backends b
     WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a
                        WHERE a.pid = b.pid AND a.backend_start = b.backend_start);
    -- Orphans: a backend still running an earlier attempt of this run (its replica
    -- stopped or lost the lease while the statement ignored the cancel and the closed
    -- connection), or any registered backend past its kill_after whose replica never
    -- terminated it. One run, one backend; nothing outlives its timeout for long.
    FOR v_orphan IN
        SELECT b.pid FROM switchboard.sql_job_backends b
          JOIN pg_catalog.pg_stat_activity a ON a.pid = b.pid AND a.backend_start = b.backend_start
         WHERE b.pid <> pg_catalog.pg_backend_pid()
           AND (b.run_id = sql_job_register.run_id OR b.kill_after <= now())
    LOOP
        PERFORM pg_catalog.pg_terminate_backend(v_orphan);
        DELETE FROM switchboard.sql_job_backends b WHERE b.pid = v_orphan;
    END LOOP;
    INSERT INTO switchboard.sql_job_backends AS b (pid, backend_start, run_id, kill_after)
    VALUES (pg_catalog.pg_backend_pid(), v_start, sql_job_register.run_id, now() + kill_after)
    ON CONFLICT ON CONSTRAINT sql_job_backends_pkey DO UPDATE
       SET backend_start = excluded.backend_start, run_id = excluded.run_id,
           kill_after = excluded.kill_after, registered_at = now();
    RETURN pg_catalog.pg_backend_pid();
END
$$;
COMMENT ON FUNCTION switchboard.sql_job_register(bigint, interval) IS
    'Called by a sql task''s own backend before its statement: registers this backend (pid, backend_start) for run_id, which must be a running run of the sql handler, so that terminate_sql_job may end it after kill_after. Returns the pid.';
REVOKE ALL ON FUNCTION switchboard.sql_job_register(bigint, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.sql_job_register(bigint, interval) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.terminate_sql_job(pid integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v record;
BEGIN
    SELECT b.* INTO v FROM switchboard.sql_job_backends b
      JOIN pg_catalog.pg_stat_activity a ON a.pid = b.pid AND a.backend_start = b.backend_start
     WHERE b.pid = terminate_sql_job.pid;
    IF NOT FOUND THEN
        -- Not registered, or that backend has ended: nothing of ours to stop.
        DELETE FROM switchboard.sql_job_backends b WHERE b.pid = terminate_sql_job.pid;
        RETURN false;
    END IF;
    IF now() < v.kill_after THEN
        RAISE EXCEPTION 'sql job backend % (run %) may not be terminated before %', v.pid, v.run_id, v.kill_after
            USING ERRCODE = '55000', HINT = 'Its timeout plus grace has not passed yet.';
    END IF;
    -- Waits (up to 5 s) until the backend has exited: its locks are free on return.
    IF NOT pg_catalog.pg_terminate_backend(v.pid, 5000) THEN
        RAISE EXCEPTION 'sql job backend % (run %) did not exit within 5 s of being terminated', v.pid, v.run_id
            USING ERRCODE = '57000', HINT = 'Retry; see pg_stat_activity for the backend.';
    END IF;
    DELETE FROM switchboard.sql_job_backends b WHERE b.pid = v.pid;
    RETURN true;
END
$$;
COMMENT ON FUNCTION switchboard.terminate_sql_job(integer) IS
    'Terminate the backend of a sql task that ran past its timeout plus grace: only a backend registered by sql_job_register, still the same backend, after its kill_after. Waits until it has exited. False if it had already ended.';
REVOKE ALL ON FUNCTION switchboard.terminate_sql_job(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.terminate_sql_job(integer) TO switchboard_app;

COMMIT;
