-- Frozen by scripts/stamp_functions.py: db/functions/*.sql as released in v0.1.0.
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

CREATE OR REPLACE FUNCTION switchboard._check_timezone(timezone text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF timezone IS NULL OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_timezone_names WHERE name = timezone) THEN
        RAISE EXCEPTION 'unknown time zone "%"', timezone
            USING ERRCODE = '22023',
                  HINT = 'Use an IANA name such as UTC or Europe/Berlin; see pg_timezone_names.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_timezone(text) FROM PUBLIC;

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
               max_attempts = v_task.max_attempts, next_run_at = v_task.next_run_at, updated_at = now()
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

-- claim_due_task: one unit of work per call, oldest due first across queued
-- runs and due ticks (a backlog of jobs cannot starve cron ticks, and vice
-- versa). Rows are taken with FOR UPDATE SKIP LOCKED, so N workers never
-- block on or double-claim the same row. A tick advances next_run_at in the
-- same transaction that creates its run: a crash after COMMIT leaves both, a
-- crash before leaves neither. Expired leases are rescued here first, so a
-- stuck maintenance run cannot block its own rescue.
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
    v_task switchboard.tasks;
    v_queued_at timestamptz;
    v_task_at timestamptz;
    v_try integer := 0;
    v_tick_first boolean;
    v_kind integer;
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
           (SELECT next_run_at FROM switchboard.tasks
             WHERE is_active AND next_run_at <= v_now ORDER BY next_run_at LIMIT 1)
      INTO v_expired, v_task_at;
    IF v_expired THEN
        PERFORM switchboard._rescue_expired_runs(100);
    END IF;

    WHILE v_try < 8 LOOP
        v_try := v_try + 1;
        IF v_try > 1 THEN
            SELECT next_run_at INTO v_task_at FROM switchboard.tasks
             WHERE is_active AND next_run_at <= v_now ORDER BY next_run_at LIMIT 1;
        END IF;
        -- The queue's head is only worth a look of its own when a tick competes
        -- with it; otherwise the claim below is the only scan of the head.
        v_queued_at := NULL;
        IF v_task_at IS NOT NULL THEN
            SELECT run_at INTO v_queued_at FROM switchboard.task_runs
             WHERE status = 'queued' AND run_at <= v_now ORDER BY run_at, id LIMIT 1;
        END IF;
        v_skipped := false;
        v_tick_first := v_task_at IS NOT NULL AND (v_queued_at IS NULL OR v_task_at <= v_queued_at);
        FOREACH v_kind IN ARRAY CASE WHEN v_tick_first THEN ARRAY[1, 2] ELSE ARRAY[2, 1] END LOOP
            IF v_kind = 1 AND v_task_at IS NOT NULL THEN
                SELECT * INTO v_task FROM switchboard.tasks
                 WHERE is_active AND next_run_at <= v_now
                 ORDER BY next_run_at LIMIT 1 FOR UPDATE SKIP LOCKED;
                IF FOUND THEN
                    UPDATE switchboard.tasks
                       SET next_run_at = switchboard._task_next_fire(v_task.schedule, v_task.timezone,
                                                                     v_task.next_run_at, v_now)
                     WHERE id = v_task.id;
                    INSERT INTO switchboard.task_runs
                        (task_id, handler, args, status, trigger, attempt, max_attempts,
                         run_at, scheduled_for, worker, lease_expires_at, started_at)
                    VALUES (v_task.id, v_task.handler, v_task.args, 'running', 'schedule', 1,
                            v_task.max_attempts, v_task.next_run_at, v_task.next_run_at,
                            v_worker, v_now + v_lease, v_now)
                    ON CONFLICT (task_id) WHERE status IN ('queued', 'running') AND task_id IS NOT NULL DO NOTHING
                    RETURNING * INTO v_run;
                    IF FOUND THEN
                        RETURN NEXT v_run;
                        RETURN;
                    END IF;
                    -- The task still has an active run: skip this tick, never overlap.
                    UPDATE switchboard.tasks SET skipped_ticks = skipped_ticks + 1 WHERE id = v_task.id;
                    v_skipped := true;
                END IF;
            ELSIF v_kind = 2 AND (v_queued_at IS NOT NULL OR v_task_at IS NULL) THEN
                UPDATE switchboard.task_runs
                   SET status = 'running', worker = v_worker, lease_expires_at = v_now + v_lease,
                       started_at = v_now
                 WHERE id = (SELECT id FROM switchboard.task_runs
                              WHERE status = 'queued' AND run_at <= v_now
                              ORDER BY run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
                RETURNING * INTO v_run;
                IF FOUND THEN
                    RETURN NEXT v_run;
                    RETURN;
                END IF;
            END IF;
        END LOOP;
        -- Nothing claimed. Look again only if a tick was skipped (more may be due);
        -- otherwise everything due is locked by other workers.
        IF NOT v_skipped THEN
            RETURN;
        END IF;
    END LOOP;
    RETURN;
END
$$;
COMMENT ON FUNCTION switchboard.claim_due_task(text, interval) IS
    'Claim at most one unit of work (a queued run or a due task tick, oldest due first) for worker, leased until now() + lease. FOR UPDATE SKIP LOCKED: concurrent workers never get the same run. Returns no row when nothing is due.';
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

CREATE OR REPLACE FUNCTION switchboard.cancel_run(run_id bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    UPDATE switchboard.task_runs
       SET status = 'abandoned', finished_at = now(), error = 'cancelled'
     WHERE id = cancel_run.run_id AND status = 'queued';
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION switchboard.cancel_run(bigint) IS
    'Cancel a queued run (it becomes abandoned with error ''cancelled''). False if the run is not queued (running runs cannot be cancelled).';
REVOKE ALL ON FUNCTION switchboard.cancel_run(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.cancel_run(bigint) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.reap_runs(keep interval DEFAULT '7 days')
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
    DELETE FROM switchboard.task_runs r
     WHERE r.status IN ('succeeded', 'failed', 'abandoned') AND r.finished_at < now() - keep;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_runs(interval) IS
    'Delete finished runs (succeeded, failed, abandoned) older than keep. Returns how many were deleted.';
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
                                  ORDER BY q.run_at, q.id
                                  LIMIT max_runs - 1 FOR UPDATE SKIP LOCKED))
        RETURNING r.*;
    END IF;
END
$$;
COMMENT ON FUNCTION switchboard.claim_due_tasks(text, interval, integer) IS
    'Claim up to max_runs units of work in one call: the first exactly as claim_due_task() (oldest due first, ticks included), the rest from the queued runs (FOR UPDATE SKIP LOCKED). No row when nothing is due.';
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
CREATE OR REPLACE FUNCTION switchboard.rate_check(
    key text, rate double precision, burst integer, cost integer DEFAULT 1)
RETURNS TABLE (allowed boolean, remaining integer, retry_after_ms integer, reset_after_ms integer)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_key text := rate_check.key;
    v_now bigint := (extract(epoch FROM now()) * 1000000)::bigint;
    v_t double precision;
    v_inc bigint;
    v_tol bigint;
    v_tat bigint;
BEGIN
    IF v_key IS NULL OR length(v_key) = 0 OR length(v_key) > 512 THEN
        RAISE EXCEPTION 'invalid rate-limit key "%"', v_key USING ERRCODE = '22023',
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
    v_t := 1000000.0 / rate;
    v_inc := round(cost * v_t)::bigint;
    v_tol := round(burst * v_t)::bigint;

    INSERT INTO switchboard.rate_limits AS r (key, tat_us, updated_at)
    VALUES (v_key, v_now + v_inc, now())
    ON CONFLICT ON CONSTRAINT rate_limits_pkey DO UPDATE
       SET tat_us = greatest(r.tat_us, v_now) + v_inc, updated_at = now()
     WHERE greatest(r.tat_us, v_now) + v_inc - v_now <= v_tol
    RETURNING r.tat_us INTO v_tat;

    IF FOUND THEN
        allowed := true;
        retry_after_ms := 0;
    ELSE
        -- Denied: the row is locked by the ON CONFLICT above, so this read is exact.
        SELECT greatest(r.tat_us, v_now) INTO v_tat FROM switchboard.rate_limits r WHERE r.key = v_key;
        allowed := false;
        retry_after_ms := ceil((v_tat + v_inc - v_now - v_tol) / 1000.0)::integer;
    END IF;
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

CREATE OR REPLACE FUNCTION switchboard.reap_rate_limits(idle interval DEFAULT '1 hour')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
    v_now bigint := (extract(epoch FROM now()) * 1000000)::bigint;
BEGIN
    IF idle IS NULL OR idle < interval '0' THEN
        RAISE EXCEPTION 'invalid idle interval "%"', idle USING ERRCODE = '22023';
    END IF;
    -- Only buckets that are full again (tat in the past) may go: deleting a
    -- bucket that still holds debt would hand out a fresh burst.
    DELETE FROM switchboard.rate_limits r
     WHERE r.updated_at < now() - idle AND r.tat_us <= v_now;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_rate_limits(interval) IS
    'Delete rate-limit keys untouched for idle whose bucket is full again. Returns how many.';
REVOKE ALL ON FUNCTION switchboard.reap_rate_limits(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_rate_limits(interval) TO switchboard_app;

-- db/functions/50_events.sql
-- Events: targeted, transactional notify.
--
-- The event lives in switchboard.events (payloads up to 1 MiB); NOTIFY on
-- channel switchboard_events carries it to every replica's relay at COMMIT
-- (and is dropped on ROLLBACK). When the JSON would not fit NOTIFY's 8000-byte
-- limit, the notification carries everything but the payload plus
-- "truncated": true, and the relay reads the row.
--
-- Ids increase in commit order. A sequence alone hands ids out at insert
-- time, so a transaction that publishes first and commits last would make a
-- reader that already saw a higher id miss it. Publishers therefore take a
-- transaction-scoped advisory lock before nextval: the next publisher waits
-- until the previous one commits or rolls back. Postgres already serialises
-- notifying commits on its notify queue lock, so the extra cost is small.
-- Consequence: publish LAST in a transaction. A caller that publishes and
-- then waits on a row lock held by another publisher deadlocks; Postgres
-- detects it and one of them gets 40P01 (never a hang).

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

CREATE OR REPLACE FUNCTION switchboard._publish(user_id uuid, room text, event text, payload jsonb)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
    v_ts timestamptz := clock_timestamp();
    v_msg text;
BEGIN
    -- Commit-order ids: see the header of this file. Key (1937204836, 1) = 'sbev'.
    PERFORM pg_advisory_xact_lock(1937204836, 1);
    v_id := nextval('switchboard.event_id_seq');
    INSERT INTO switchboard.events (id, user_id, room, event, payload, created_at)
    VALUES (v_id, _publish.user_id, _publish.room, _publish.event, _publish.payload, v_ts);
    v_msg := json_build_object('id', v_id, 'user_id', _publish.user_id, 'room', _publish.room,
                               'event', _publish.event,
                               'ts', (extract(epoch FROM v_ts) * 1000)::bigint,
                               'payload', _publish.payload)::text;
    IF octet_length(v_msg) > 7900 THEN
        v_msg := json_build_object('id', v_id, 'user_id', _publish.user_id, 'room', _publish.room,
                                   'event', _publish.event,
                                   'ts', (extract(epoch FROM v_ts) * 1000)::bigint,
                                   'truncated', true)::text;
    END IF;
    PERFORM pg_notify('switchboard_events', v_msg);
    RETURN v_id;
END
$$;
REVOKE ALL ON FUNCTION switchboard._publish(uuid, text, text, jsonb) FROM PUBLIC;

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
    'Publish an event to every socket of user_id on every replica, iff the calling transaction commits. Returns the event id (ids increase in commit order). Payload up to 1 MiB. Call it LAST in a transaction: publishers are serialised until COMMIT.';
REVOKE ALL ON FUNCTION switchboard.notify_user(uuid, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.notify_user(uuid, text, jsonb) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.notify_room(room text, event text, payload jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_event(event, payload, 1048576);
    IF room IS NULL OR NOT EXISTS (SELECT 1 FROM switchboard.rooms r WHERE r.name = notify_room.room) THEN
        RAISE EXCEPTION 'room "%" does not exist', room USING ERRCODE = 'P0002',
            HINT = 'A room exists once it has a member: add_room_member(room, user_id).';
    END IF;
    RETURN switchboard._publish(NULL, room, event, payload);
END
$$;
COMMENT ON FUNCTION switchboard.notify_room(text, text, jsonb) IS
    'Publish an event to every member of room with a socket joined to it, on every replica, iff the calling transaction commits. Returns the event id. Call it LAST in a transaction.';
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

-- The relay's read of an event whose NOTIFY was truncated (payload > ~7.9 kB).
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

CREATE OR REPLACE FUNCTION switchboard.reap_events(keep interval DEFAULT '5 minutes')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
    v_max bigint;
BEGIN
    IF keep IS NULL OR keep < interval '0' THEN
        RAISE EXCEPTION 'invalid keep interval "%"', keep USING ERRCODE = '22023';
    END IF;
    WITH gone AS (
        DELETE FROM switchboard.events e WHERE e.created_at < now() - keep RETURNING e.id
    )
    SELECT count(*), max(id) INTO v_n, v_max FROM gone;
    IF v_max IS NOT NULL THEN
        UPDATE switchboard.event_horizon SET reaped_through = greatest(reaped_through, v_max);
    END IF;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_events(interval) IS
    'Delete events older than keep (the resume window, default 5 minutes) and advance event_horizon(). Returns how many.';
REVOKE ALL ON FUNCTION switchboard.reap_events(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_events(interval) TO switchboard_app;

-- Client events (typing, tool results) are published on the bus, tagged with
-- the sender, never stored, and have no id. The sender must belong to the
-- room; the function checks it so no replica can be tricked into relaying.
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
    PERFORM pg_notify('switchboard_events',
        json_build_object('id', NULL, 'user_id', NULL, 'room', room, 'event', event,
                          'ts', (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
                          'from', sender, 'ephemeral', true, 'payload', payload)::text);
END
$$;
COMMENT ON FUNCTION switchboard.publish_client_event(uuid, text, text, jsonb) IS
    'Relay an ephemeral client event (e.g. typing) from sender to a room it belongs to: NOTIFY only, never stored, no id, payload up to 4 kB. 42501 if sender is not a member.';
REVOKE ALL ON FUNCTION switchboard.publish_client_event(uuid, text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.publish_client_event(uuid, text, text, jsonb) TO switchboard_app;

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

-- Inlined into its callers like _wake_workers: no SET clause, qualified names.
CREATE OR REPLACE FUNCTION switchboard._announce(msg jsonb)
RETURNS void
LANGUAGE sql
AS $$ SELECT pg_catalog.pg_notify('switchboard_control', msg::pg_catalog.text) $$;
REVOKE ALL ON FUNCTION switchboard._announce(jsonb) FROM PUBLIC;

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
    'Create a user with an argon2/bcrypt hash (hashed by the server) and a role (admin or member). Returns the id. 23505 if the name is taken.';
REVOKE ALL ON FUNCTION switchboard.create_user(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.create_user(text, text, text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.find_user(username text)
RETURNS TABLE (id uuid, username text, role text, disabled boolean)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT u.id, u.username, u.role, u.disabled FROM switchboard.users u WHERE u.username = find_user.username $$;
COMMENT ON FUNCTION switchboard.find_user(text) IS 'Look a user up by name (no password hash). No row if unknown.';
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
                   FROM switchboard.users u WHERE u.username = login_lookup.username;
END
$$;
COMMENT ON FUNCTION switchboard.login_lookup(text) IS
    'The one way the application reads a password hash: for verifying a login. No row if the user is unknown.';
REVOKE ALL ON FUNCTION switchboard.login_lookup(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.login_lookup(text) TO switchboard_app;

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
    PERFORM switchboard._announce(jsonb_build_object(
        'kind', 'user', 'user_id', v.id, 'role', v.role, 'disabled', v.disabled));
END
$$;
REVOKE ALL ON FUNCTION switchboard._user_changed(uuid) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard.set_user_role(user_id uuid, role text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_role(role);
    UPDATE switchboard.users u SET role = set_user_role.role, updated_at = now() WHERE u.id = set_user_role.user_id;
    PERFORM switchboard._user_changed(user_id);
END
$$;
COMMENT ON FUNCTION switchboard.set_user_role(uuid, text) IS
    'Change a user''s role (admin or member). Announced at COMMIT: every replica re-checks the user''s sockets and tokens within a second.';
REVOKE ALL ON FUNCTION switchboard.set_user_role(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.set_user_role(uuid, text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.set_user_password_hash(user_id uuid, password_hash text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_hash(password_hash);
    UPDATE switchboard.users u SET password_hash = set_user_password_hash.password_hash, updated_at = now()
     WHERE u.id = set_user_password_hash.user_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user % does not exist', user_id USING ERRCODE = 'P0002';
    END IF;
END
$$;
COMMENT ON FUNCTION switchboard.set_user_password_hash(uuid, text) IS
    'Replace a user''s password hash (argon2/bcrypt, computed by the server).';
REVOKE ALL ON FUNCTION switchboard.set_user_password_hash(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.set_user_password_hash(uuid, text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.disable_user(user_id uuid)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE switchboard.users u SET disabled = true, updated_at = now() WHERE u.id = disable_user.user_id;
    DELETE FROM switchboard.tickets t WHERE t.user_id = disable_user.user_id;
    PERFORM switchboard._user_changed(user_id);
END
$$;
COMMENT ON FUNCTION switchboard.disable_user(uuid) IS
    'Disable a user: tickets are dropped, and at COMMIT every replica closes the user''s sockets and refuses its tokens (within a second).';
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
    PERFORM switchboard._announce(jsonb_build_object('kind', 'revoke', 'jti', jti, 'user_id', user_id));
END
$$;
COMMENT ON FUNCTION switchboard.revoke_token(text, uuid, timestamptz) IS
    'Revoke an access token (logout) on every replica until it would have expired.';
REVOKE ALL ON FUNCTION switchboard.revoke_token(text, uuid, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.revoke_token(text, uuid, timestamptz) TO switchboard_app;

-- What a replica needs to (re)build its view of revoked tokens and changed
-- users after it (re)connects its LISTEN connection and may have missed
-- announcements.
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
        PERFORM switchboard._announce(jsonb_build_object('kind', 'member', 'room', room, 'user_id', user_id, 'member', true));
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
        PERFORM switchboard._announce(jsonb_build_object('kind', 'member', 'room', room, 'user_id', user_id, 'member', false));
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

-- db/functions/70_replicas.sql
-- Replica registry, presence and the tool bridge.
--
-- Each replica upserts its row every few seconds; presence rows hang off it
-- (ON DELETE CASCADE), so when a replica dies and reap_replicas() removes its
-- row, its users stop being "online" without anyone having to clean up.

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
    'Register or refresh a replica (called every few seconds by each server process).';
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
    DELETE FROM switchboard.replica_registry r WHERE r.heartbeat_at < now() - stale;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_replicas(interval) IS
    'Forget replicas that stopped heartbeating (and their presence). Returns how many.';
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
           (SELECT coalesce(sum(p.sockets), 0) FROM switchboard.presence_sockets p WHERE p.replica_id = r.id) AS sockets
      FROM switchboard.replica_registry r
     WHERE r.heartbeat_at > now() - interval '30 seconds';
COMMENT ON VIEW switchboard.replicas IS 'Live replicas (heartbeat within 30 seconds) and their open sockets.';
GRANT SELECT ON switchboard.replicas TO switchboard_app;

CREATE OR REPLACE VIEW switchboard.presence AS
    SELECT p.user_id, u.username, p.replica_id, p.sockets, p.since
      FROM switchboard.presence_sockets p
      JOIN switchboard.replica_registry r ON r.id = p.replica_id
      LEFT JOIN switchboard.users u ON u.id = p.user_id
     WHERE r.heartbeat_at > now() - interval '30 seconds';
COMMENT ON VIEW switchboard.presence IS 'Which users have sockets on which live replica.';
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
                      AND r.heartbeat_at > now() - interval '30 seconds');
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
CREATE OR REPLACE FUNCTION switchboard.presence_sync(replica_id text, user_ids uuid[], sockets integer[])
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF coalesce(array_length(user_ids, 1), 0) <> coalesce(array_length(sockets, 1), 0) THEN
        RAISE EXCEPTION 'user_ids and sockets differ in length' USING ERRCODE = '22023';
    END IF;
    INSERT INTO switchboard.replica_registry (id) VALUES (replica_id)
    ON CONFLICT ON CONSTRAINT replica_registry_pkey DO UPDATE SET heartbeat_at = now();
    DELETE FROM switchboard.presence_sockets p
     WHERE p.replica_id = presence_sync.replica_id AND p.user_id <> ALL (coalesce(user_ids, '{}'));
    INSERT INTO switchboard.presence_sockets AS p (replica_id, user_id, sockets)
    SELECT presence_sync.replica_id, u, s FROM unnest(user_ids, sockets) AS x(u, s) WHERE s > 0
    ON CONFLICT ON CONSTRAINT presence_sockets_pkey DO UPDATE SET sockets = EXCLUDED.sockets;
END
$$;
COMMENT ON FUNCTION switchboard.presence_sync(text, uuid[], integer[]) IS
    'Replace all presence rows of replica_id with the given users and socket counts (called with each heartbeat).';
REVOKE ALL ON FUNCTION switchboard.presence_sync(text, uuid[], integer[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.presence_sync(text, uuid[], integer[]) TO switchboard_app;

-- db/functions/80_status.sql
-- One look for a DBA, and the maintenance sweep.

CREATE OR REPLACE FUNCTION switchboard.status()
RETURNS TABLE (item text, value bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'tasks_due', count(*) FROM switchboard.tasks WHERE is_active AND next_run_at <= now()
    UNION ALL SELECT 'tasks_active', count(*) FROM switchboard.tasks WHERE is_active
    UNION ALL SELECT 'runs_' || s, (SELECT count(*) FROM switchboard.task_runs r WHERE r.status = s)
      FROM unnest(ARRAY['queued', 'running', 'succeeded', 'failed', 'abandoned']) AS s
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
$$;
COMMENT ON FUNCTION switchboard.status() IS
    'One look at the system: due tasks, runs by status, expired leases, live tickets, rate-limit keys, event backlog, live replicas, sockets.';
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
    'Run every reaper once (expired leases, old runs, tickets, idle rate-limit keys, old events, dead replicas, expired revocations, stale tool calls). Returns counts per reaper.';
REVOKE ALL ON FUNCTION switchboard.maintenance(interval, interval, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.maintenance(interval, interval, interval, interval) TO switchboard_app;

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
    'Run one SQL statement as the restricted role switchboard_job (the sql task handler). The statement cannot switch roles; it must schema-qualify table names. Returns {"rowcount", "role"}.';
REVOKE ALL ON FUNCTION switchboard.run_job_sql(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.run_job_sql(text) TO switchboard_app;

COMMIT;
