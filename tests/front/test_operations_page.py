"""The operations page: the horde now (processing, lapsed, queue depth) and its last hour."""

import re
from datetime import timedelta

from jobs.services import abort_stale_generations
from tests.conftest import progress, queue_chat

PAGE = "/admin/operations/"
# Minutes no other test counts in, so that the per-minute counters start at zero; before
# the real date, so that the moderator's session (made at the real time) has not expired.
START = "2026-09-14 10:00:00+00:00"


def numbers(html: str) -> dict[str, int]:
    """The big numbers by their element id, and the last hour's totals by row label."""
    found = {
        name: int(value)
        for name, value in re.findall(r'id="ops-([a-z]+)">\s*(?:<a [^>]*>)?<span class="value">(\d+)', html)
    }
    for label, total in re.findall(r'<th scope="row">([^<]+)</th>\s*<td class="ops-total">(\d+)</td>', html):
        found[label] = int(total)
    for jobs, kind, requests in re.findall(
        r'ops-queue">\s*<span class="value">(\d+)</span>\s*(\w+) jobs queued \((\d+) request', html
    ):
        found[f"{kind} queued"] = int(jobs)
        found[f"{kind} requests"] = int(requests)
    return found


def test_the_page_shows_processing_lapsed_queue_depth_and_the_last_hour(
    moderator, owner, requester, chat_job, time_machine, django_capture_on_commit_callbacks
):
    time_machine.move_to(START, tick=False)
    chat = chat_job(owner)  # two pops by an unmeasured chat worker declaring 16384: capacity-limited
    owner.pop("text-worker", models=["m1"])
    for _ in range(3):
        requester.request_text(models=["m1"])
    text = owner.pop("text-worker", models=["m1"]).json()
    queue_chat(requester, 300)
    time_machine.shift(100)
    assert progress(owner, chat["id"], 1).json()["lease"] == "granted"
    time_machine.shift(100)  # the text job's lease (150 s) lapsed; the chat one runs to 250 s

    page = moderator.get(PAGE)
    assert page.status_code == 200
    shown = numbers(page.content.decode())
    assert shown["processing"] == 2
    assert shown["lapsed"] == 1
    assert (shown["text queued"], shown["text requests"]) == (2, 3 - 1)
    assert (shown["chat queued"], shown["chat requests"]) == (1, 1)
    assert shown["Lease renewals granted"] == 1
    assert shown["Stale aborts"] == 0
    assert shown["Capacity-limited pops"] == 2
    assert (shown["workers"], shown["limited"]) == (2, 1)  # the chat worker, now: not its pops

    with django_capture_on_commit_callbacks(execute=True):  # the pass counts after its commit
        abort_stale_generations(now=page.context["operations"].now)
    shown = numbers(moderator.get(PAGE).content.decode())
    assert (shown["processing"], shown["lapsed"]) == (1, 0)
    assert shown["text queued"] == 3  # the aborted job went back to its request
    assert shown["Stale aborts"] == 1
    series = {s.label: s for s in moderator.get(PAGE).context["operations"].series}
    assert series["Stale aborts"].by_trust == {"trusted": 0, "untrusted": 1}
    # Minute by minute, the current one last: the renewal at 10:01:40, the abort at 10:03:20.
    assert series["Lease renewals granted"].counts[-3:] == [1, 0, 0]
    assert series["Stale aborts"].counts[-1] == 1
    assert text["id"]


def test_the_page_says_since_when_the_totals_count(moderator, time_machine):
    from hordeops import metrics

    time_machine.move_to(START, tick=False)
    metrics._redis().delete(metrics.METRICS_KEY)  # as after a Redis restart
    page = moderator.get(PAGE).content.decode()
    assert '<span id="ops-counting-since">2026-09-14 10:00:00</span> UTC' in page


def test_counts_older_than_an_hour_leave_the_page(moderator, owner, chat_job, time_machine):
    time_machine.move_to("2026-09-15 10:00:00+00:00", tick=False)
    chat = chat_job(owner)
    progress(owner, chat["id"], 1)
    assert numbers(moderator.get(PAGE).content.decode())["Lease renewals granted"] == 1
    time_machine.shift(timedelta(minutes=59))
    assert numbers(moderator.get(PAGE).content.decode())["Lease renewals granted"] == 1
    time_machine.shift(timedelta(minutes=1))
    assert numbers(moderator.get(PAGE).content.decode())["Lease renewals granted"] == 0


def test_the_chart_draws_one_bar_per_busy_minute_scaled_to_the_busiest(
    moderator, owner, chat_job, time_machine
):
    time_machine.move_to("2026-09-16 10:00:00+00:00", tick=False)
    chat = chat_job(owner)
    for seq in (1, 2):
        progress(owner, chat["id"], seq)
    time_machine.shift(60)
    progress(owner, chat["id"], 3)
    [series] = [
        s for s in moderator.get(PAGE).context["operations"].series if s.label == "Lease renewals granted"
    ]
    busy = [bar for bar in series.bars() if bar.count]
    assert [(bar.minute, bar.count) for bar in busy] == [(1, 2), (0, 1)]
    assert busy[0].height == 48 and busy[1].height == 24


def test_the_admin_index_links_the_page_for_moderators(moderator):
    assert PAGE.encode() in moderator.get("/admin/").content


def test_staff_outside_the_moderators_are_refused_the_page(plain_staff):
    assert plain_staff.get(PAGE).status_code == 403


def test_staff_outside_the_moderators_get_no_link_to_the_page(plain_staff):
    index = plain_staff.get("/admin/")
    assert index.status_code == 200 and PAGE.encode() not in index.content
