"""The demo page's "Chat (streams)" section in Chromium, on two real replicas.

Both replicas load examples/ai_chat (SWITCHBOARD_HANDLERS=ai_chat). An admin on the page
served by replica A asks; the answer grows; the page is reloaded mid-answer and rebuilds
the text from seq 0 (client.streams() on load), which must end exactly as the stream's
final text and the deterministic model's output: no gap, no repeat. Then a second answer
is followed by a page served by replica B (same user, another browser context) and
stopped there: both pages show it stopped, the run's result says stopped, and SQL holds
no chunk after the stop (max(seq) = last_seq). Without the handler the page says how to
start the server with it.

Waits are on DOM state (Playwright's expect / wait_for_function) and on SQL, never sleeps.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sys
import time

import psycopg
import pytest

from harness import ROOT, make_user
from test_page import WAIT, browser, log_in, page, shot  # noqa: F401

pytestmark = pytest.mark.browser

HANDLERS_ENV = {"SWITCHBOARD_HANDLERS": "ai_chat",
                "PYTHONPATH": f"{ROOT / 'server'}:{ROOT / 'examples' / 'ai_chat'}"}


def model_text(prompt: str, tokens: int) -> str:
    """What the example's deterministic fake model answers (unpaced)."""
    sys.path.insert(0, str(ROOT / "examples" / "ai_chat"))
    from ai_chat import fake_model

    async def collect() -> str:
        return "".join([t async for t in fake_model(prompt, tokens, 0)])
    # in a thread of its own: Playwright's sync API runs an event loop in this one
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, collect()).result(timeout=30)


def stream_row(db: str, sid: str) -> tuple[str, int, dict | None, int, int | None, str]:
    """status, last_seq, final, count(chunks), max(seq), the chunks' text in seq order."""
    with psycopg.connect(db, autocommit=True) as c:
        st, last, final = c.execute("SELECT status, last_seq, final FROM switchboard.streams WHERE id = %s",
                                    (sid,)).fetchone()
        n, mx, text = c.execute("SELECT count(*), max(seq), coalesce(string_agg(data, '' ORDER BY seq), '') "
                                "FROM switchboard.stream_chunks WHERE stream_id = %s", (sid,)).fetchone()
    return st, last, final, n, mx, text


def wait_run(db: str, sid: str, timeout: float = 60) -> dict:
    """The result of the ai_chat run that wrote stream ``sid``, once it finished."""
    deadline = time.time() + timeout
    with psycopg.connect(db, autocommit=True) as c:
        while time.time() < deadline:
            row = c.execute("SELECT status, result, error FROM switchboard.task_runs "
                            "WHERE handler = 'ai_chat.complete' AND result->>'stream' = %s", (sid,)).fetchone()
            if row and row[0] in ("succeeded", "failed", "cancelled", "abandoned"):
                assert row[0] == "succeeded", row
                return row[1]
            time.sleep(0.1)
    raise TimeoutError(f"the run of stream {sid} did not finish")


def seq_of(pg) -> int:  # type: ignore[no-untyped-def]
    return int(pg.locator("#answer").get_attribute("data-seq") or 0)


def test_chat_reload_mid_answer_and_stop_from_another_replica(page, browser, server_factory, db) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from playwright.sync_api import expect

    make_user(db, "admin", role="admin")
    ra = server_factory(env=HANDLERS_ENV, name="ra")
    rb = server_factory(env=HANDLERS_ENV, name="rb")
    answer, status = page.locator("#answer"), page.locator("#chat-status")

    # -- page A (replica A): Ask, some text, reload mid-answer -----------------------------------
    page.goto(ra.base + "/")
    log_in(page, "admin")
    expect(page.locator("#conn")).to_have_attribute("data-state", "connected", timeout=WAIT)
    expect(page.locator("#chat-section")).to_be_visible()
    prompt = "tell me about PostgreSQL"
    page.get_by_label("Prompt").fill(prompt)
    page.get_by_role("button", name="Ask").click()
    page.wait_for_function("() => Number(document.querySelector('#answer').dataset.seq || 0) >= 30", timeout=WAIT)
    sid = answer.get_attribute("data-stream")
    assert sid
    assert stream_row(db, sid)[0] == "open"               # the reload comes mid-answer
    before = answer.text_content()
    assert before and len(before.split()) >= 30
    page.reload()
    page.wait_for_function("() => document.body.dataset.session === 'restored'", timeout=WAIT)
    expect(answer).to_have_attribute("data-stream", sid, timeout=WAIT)   # found again by client.streams()
    assert stream_row(db, sid)[0] == "open", "the answer ended before the page came back: no resume shown"
    expect(status).to_have_attribute("data-state", "done", timeout=30_000)
    st, last, final, n, mx, chunks = stream_row(db, sid)
    shown = answer.text_content()
    assert (st, last, n, mx) == ("done", 400, 400, 400)
    assert seq_of(page) == 400
    assert shown.startswith(before)
    assert shown == chunks == final["text"] == model_text(prompt, 400)   # no gap, no repeat
    assert wait_run(db, sid) == {"stream": sid, "stopped": False, "chunks": 400}
    expect(status).to_have_text("Done (400 chunks).")
    shot(page, "10-chat-after-reload")

    # -- page B (replica B, same user): follows the next answer and stops it -----------------------
    ctx_b = browser.new_context(viewport={"width": 1360, "height": 900})
    try:
        pb = ctx_b.new_page()
        b_errors: list[str] = []
        pb.on("pageerror", lambda e: b_errors.append(str(e)))
        pb.goto(rb.base + "/")
        log_in(pb, "admin")
        expect(pb.locator("#conn")).to_have_attribute("data-state", "connected", timeout=WAIT)
        assert pb.locator("#replica").inner_text() != page.locator("#replica").inner_text()
        page.get_by_label("Prompt").fill("stop me")
        page.get_by_role("button", name="Ask").click()
        expect(answer).not_to_have_attribute("data-stream", sid, timeout=WAIT)
        sid2 = answer.get_attribute("data-stream")
        expect(pb.locator("#answer")).to_have_attribute("data-stream", sid2, timeout=WAIT)  # via chat.answer
        pb.wait_for_function("() => Number(document.querySelector('#answer').dataset.seq || 0) >= 20", timeout=WAIT)
        stop = pb.get_by_role("button", name="Stop")
        expect(stop).to_be_enabled()
        stop.click()
        expect(pb.locator("#chat-status")).to_have_attribute("data-state", "stopped", timeout=WAIT)
        expect(status).to_have_attribute("data-state", "stopped", timeout=WAIT)
        result = wait_run(db, sid2)
        st, last, final, n, mx, chunks = stream_row(db, sid2)
        assert st == "stopped" and result["stopped"] is True and result["chunks"] == last
        assert 20 <= last < 400 and n == mx == last                        # no chunk after the stop
        for pg in (page, pb):
            assert seq_of(pg) == last
            assert pg.locator("#answer").text_content() == chunks
            expect(pg.locator("#chat-status")).to_have_text(f"Stopped after {last} chunks.")
            expect(pg.get_by_role("button", name="Stop")).to_be_disabled()
        time.sleep(1.0)                                                     # were it still writing ...
        assert stream_row(db, sid2)[3:5] == (last, last)                   # ... a chunk would be here
        shot(pb, "11-chat-stopped-on-replica-b")
        assert b_errors == []
    finally:
        ctx_b.close()
    assert page.js_errors == []


def test_chat_without_the_handler_says_how_to_start_it(page, server_factory, db) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from playwright.sync_api import expect

    make_user(db, "admin", role="admin")
    make_user(db, "mel")
    s = server_factory(name="plain")
    page.goto(s.base + "/")
    log_in(page, "admin")
    expect(page.locator("#conn")).to_have_attribute("data-state", "connected", timeout=WAIT)
    page.get_by_label("Prompt").fill("<img src=x onerror=alert(1)>")
    page.get_by_role("button", name="Ask").click()
    expect(page.locator("#chat-status")).to_have_text("The chat handler is not loaded.", timeout=WAIT)
    expect(page.locator("#chat-error")).to_contain_text(
        "SWITCHBOARD_HANDLERS=ai_chat PYTHONPATH=examples/ai_chat switchboard dev")
    assert page.locator("#answer img").count() == 0
    with psycopg.connect(db, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE handler = %s", ("ai_chat.complete",)).fetchone()[0] == 0
    # a member sees no chat section
    page.get_by_role("button", name="Log out").click()
    log_in(page, "mel")
    expect(page.locator("#conn")).to_have_attribute("data-state", "connected", timeout=WAIT)
    expect(page.locator("#chat-section")).to_be_hidden()
    assert page.js_errors == [], json.dumps(page.js_errors)
