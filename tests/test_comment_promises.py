"""Every promise a function's COMMENT makes names the test that checks it (issue 32).

A DBA reads `\\df+ switchboard.*` and takes the COMMENTs at their word. One said
"Complete: once id N was seen, no event with id <= N can still commit" for years
after V0009 had made it false, because nothing tied the sentence to a test. So:
every COMMENT in the migrated catalog is scanned for promise words, and each
function that uses one must be listed in PROMISES below with the tests that check
exactly that promise. A new promise without a test fails here; so does a mapping to
a test that does not exist, or to a function that no longer promises anything.
When no test checks a promise, write one -- or say less in the COMMENT.

A mapped test is "path.py::test_name" (the function must exist in that module) or
"db/tests/<file>.sql::<description>" (a pgTAP assertion with that description).
"""

from __future__ import annotations

import ast
import re

import psycopg

from harness import ROOT

# Words by which a COMMENT promises behaviour (whole words, case-insensitive).
PROMISE_WORDS = ("exactly once", "at most once", "at least once", "only once", "single use", "single-use",
                 "commit order", "delivery order", "in order", "complete", "exactly", "never", "atomic",
                 "no gap", "at least", "guarantee")

# regprocedure text -> (the promise, in short; the tests that check it).
PROMISES: dict[str, tuple[str, tuple[str, ...]]] = {
    "switchboard.claim_due_task(text,interval)": (
        "concurrent workers never get the same run", (
            "tests/test_scheduler.py::test_eight_workers_claim_ten_thousand_jobs_exactly_once",)),
    "switchboard.consume_ticket_v2(text)": (
        "a ticket is consumed exactly once", (
            "tests/test_tickets.py::test_a_ticket_is_consumed_once_under_concurrency",
            "db/tests/20_tickets_ratelimit.sql::the second use returns no row: single use")),
    "switchboard.refresh_session_v2(text,interval,interval,bytea,double precision,integer)": (
        "calls racing with one token hand out exactly one successor", (
            "tests/test_sessions_hardening.py::test_racing_connections_never_make_two_live_successors",
            "tests/test_sessions_hardening.py::test_many_simultaneous_refreshes_of_one_token_hand_out_exactly_one_successor")),
    "switchboard.rate_check(text,double precision,integer,integer)": (
        "a fresh key admits exactly burst requests at once", (
            "tests/test_ratelimit.py::test_fresh_key_admits_exactly_burst_under_concurrency",
            "db/tests/20_tickets_ratelimit.sql::third: allowed, none left")),
    "switchboard.notify_user(uuid,text,jsonb)": (
        "ids follow inserts, not commit order; the delivery order is ticks; publishers never wait", (
            "tests/test_events.py::test_publishers_never_wait_and_resume_is_exact_under_out_of_order_commits",
            "tests/test_trust_boundary.py::test_a_publisher_never_waits_for_another_publisher_or_the_ticker")),
    "switchboard.events_since_v2(uuid,bigint,bigint,text[],bigint,integer)": (
        "every event after the position exactly once, in delivery order, under any commit order", (
            "tests/test_events.py::test_publishers_never_wait_and_resume_is_exact_under_out_of_order_commits",
            "tests/test_events.py::test_cursor_is_complete_under_concurrent_publishers",
            "tests/test_events_dba.py::test_the_docs_resume_keeps_an_event_that_commits_after_a_higher_id")),
    "switchboard.event_window()": (
        "a position above first_tick (or all of it) is complete; older ones get resume_gap", (
            "tests/test_events.py::test_reap_events_counts_retention_from_the_tick_and_advances_the_window",
            "tests/test_reap_events_batched.py::test_bounded_reap_deletes_at_most_max_rows_and_moves_the_horizon_first",
            "tests/test_long_absence.py::test_cursor_below_the_horizon_gets_resume_gap")),
    "switchboard.relay_read_v3(bigint,bigint,bigint[],integer)": (
        "stored events after the position in delivery order, after the window row", (
            "db/tests/30_events.sql::relay_read_v3: the retained window, then every event after the position",
            "tests/test_event_bus_proof.py::test_silent_publishers_are_delivered_by_the_relays_ticker",
            "tests/test_event_bus_proof.py::test_randomized_publishers_resuming_clients_and_a_killed_replica")),
    "switchboard.relay_read_v2(bigint,bigint,bigint[],integer)": (
        "the 0.2.x relay's read: events after the position in delivery order", (
            "db/tests/30_events.sql::relay_read_v2: every event after the position, max_rows of them",
            "tests/test_event_rollout.py::test_previous_release_replica_beside_a_new_one")),
    "switchboard.reap_events(interval)": (
        "kept at least keep after COMMIT (from the covering tick, never from the insert); "
        "with no relay ticking a call ticks itself", (
            "tests/test_events.py::test_reap_events_counts_retention_from_the_tick_and_advances_the_window",
            "tests/test_events_dba.py::test_reap_events_honours_keep_with_no_ticker",
            "tests/test_events_dba.py::test_reap_ticks_only_when_no_relay_ticked_since_its_previous_call",
            "tests/test_event_partitions.py::test_a_populated_020_database_migrates_to_head_while_publishing")),
    "switchboard.reap_events(interval,integer)": (
        "as reap_events(keep), in batches of max_rows; the window moves first", (
            "tests/test_reap_events_batched.py::test_bounded_reap_deletes_at_most_max_rows_and_moves_the_horizon_first",
            "tests/test_events_dba.py::test_reap_events_honours_keep_with_no_ticker",
            "tests/test_events_dba.py::test_reap_ticks_only_when_no_relay_ticked_since_its_previous_call",
            "tests/test_event_partitions.py::test_publishers_racing_partition_drops_lose_nothing_silently",
            "tests/test_event_partitions.py::test_a_steady_rate_never_lands_in_default_and_old_partitions_go")),
    "switchboard.publish_client_event(uuid,text,text,jsonb)": (
        "never stored in events, no id", (
            "tests/test_events.py::test_a_client_event_is_never_stored_and_has_no_id",)),
    "switchboard.stream_append(uuid,text[])": (
        "chunks in order, numbered from 1 with no gap", (
            "tests/test_streams_sql.py::test_racing_appenders_number_every_chunk_once_without_gaps",)),
    "switchboard.event_live_path(boolean,integer,boolean,boolean)": (
        "send_id_hints false stops the {\"id\"} hints while the path is on (to be switched only once "
        "no previous-release replica, which wakes on them, runs)", (
            "tests/test_live_path.py::test_id_hints_stop_only_while_the_live_path_carries_the_event",)),
    "switchboard.tool_call_answer(uuid,uuid,jsonb)": (
        "accepted only from the user the call went to, only once, before it expires", (
            "tests/test_users_rooms.py::test_tool_call_bridge",)),
}


def _promises(comment: str) -> list[str]:
    return [w for w in PROMISE_WORDS if re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", comment, re.I)]


def _catalog(url: str) -> dict[str, list[str]]:
    """regprocedure (without spaces after commas) -> the promise words of its COMMENT."""
    with psycopg.connect(url) as c:
        rows = c.execute("SELECT p.oid::regprocedure::text, obj_description(p.oid, 'pg_proc') FROM pg_proc p "
                         "WHERE p.pronamespace = 'switchboard'::regnamespace").fetchall()
    return {re.sub(r",\s+", ",", sig): _promises(comment or "") for sig, comment in rows}


def _test_exists(ref: str) -> bool:
    path, _, name = ref.partition("::")
    f = ROOT / path
    if not f.is_file() or not name:
        return False
    if path.endswith(".sql"):
        return f"'{name}'" in f.read_text().replace("''", "'")
    tree = ast.parse(f.read_text())
    return any(isinstance(n, ast.FunctionDef) and n.name == name and n.name.startswith("test_")
               for n in tree.body)


def test_every_promise_in_a_comment_names_its_tests(pg, template_db: str) -> None:  # type: ignore[no-untyped-def]
    promising = {sig: words for sig, words in _catalog(pg.url(template_db)).items() if words}
    assert len(promising) >= 10, "suspiciously few promises: did the scan break?"
    unmapped = {sig: words for sig, words in promising.items() if sig not in PROMISES}
    assert unmapped == {}, ("these COMMENTs promise something no test is named for; add them to PROMISES "
                            f"with the tests that check it, or say less: {unmapped}")
    stale = sorted(set(PROMISES) - set(promising))
    assert stale == [], f"PROMISES lists functions whose COMMENT promises nothing (or that are gone): {stale}"


def test_every_mapped_test_exists() -> None:
    missing = [(sig, ref) for sig, (_, refs) in PROMISES.items() for ref in refs if not _test_exists(ref)]
    assert missing == []
    assert all(refs for _, refs in PROMISES.values())


def test_the_scanner_finds_the_words() -> None:
    assert _promises("Complete: once id N was seen, no event can still commit") == ["complete"]
    assert _promises("every event exactly once, in delivery order") == ["exactly once", "delivery order",
                                                                          "exactly"]
    assert _promises("incomplete, single-user, non-atomic") == []
    assert _test_exists("tests/test_comment_promises.py::test_the_scanner_finds_the_words")
    assert not _test_exists("tests/test_comment_promises.py::test_nothing_of_the_kind")
    assert _test_exists("db/tests/30_events.sql::relay_read_v2: every event after the position, max_rows of them")
