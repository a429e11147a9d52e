-- Cron schedules: parsing, validation and "next fire time", in PL/pgSQL.
--
-- cron_next() runs inside every scheduler claim, so it is built for speed
-- (bench/cron_bench.py against croniter's get_next: BENCHMARKS.md figure 8). An
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
-- loaded zones, so this is cheap; the old check scanned pg_timezone_names
-- (it reads every zone file on every call: BENCHMARKS.md, "December 2026:
-- same-run before/after", the zone check row) and, being
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
