"""The AI Horde's status and statistics routes over the text flow: /status/models,
/status/models/{name}, /status/performance, /status/modes, /stats/text/totals and
/stats/text/models. They are cached (2 s, 50 s) as the AI Horde caches them."""

from django.core.cache import cache

from jobs import discovery
from workers.models import Worker


def test_status_models_lists_what_online_workers_serve_and_what_waits_for_each(requester, owner):
    owner.pop("a", models=["m1", "m2"], threads=2)
    owner.pop("b", models=["m1"])
    Worker.objects.filter(name="b").update(speed=20.0)
    requester.request_text(models=["m1"], params={"max_length": 100, "n": 3})
    requester.request_text(models=["orphan-model"], params={"max_length": 50})
    models = {m["name"]: m for m in requester.client.get("/api/v2/status/models?type=text").json()}
    assert set(models) == {"m1", "m2", "orphan-model"}
    assert models["m1"] == {
        "name": "m1",
        "count": 3,  # threads of the online workers serving it
        "performance": 20.0,  # their mean measured speed
        "queued": 300.0,  # tokens waiting
        "jobs": 3.0,
        "eta": 5,  # 300 tokens / (3 threads x 20 tokens/s)
        "type": "text",
    }
    assert (models["orphan-model"]["count"], models["orphan-model"]["eta"]) == (0, 10000)
    assert (models["m2"]["queued"], models["m2"]["eta"]) == (0.0, 0)
    one = requester.client.get("/api/v2/status/models/m1").json()
    assert one == [models["m1"]]
    assert requester.client.get("/api/v2/status/models/nobody-has-this").json() == []
    assert requester.client.get("/api/v2/status/models").json() == []  # type=image, the AI Horde's default
    only_big = requester.client.get("/api/v2/status/models?type=text&min_count=3").json()
    assert [m["name"] for m in only_big] == ["m1"]
    assert requester.client.get("/api/v2/status/models?type=text&model_state=custom").json() == []
    assert requester.client.get("/api/v2/status/models?type=video").status_code == 400
    # '²' passes str.isdigit() and fails int(), as do 4,301 digits: each was a 500.
    for bad in ("x", "²", "①", "١", "-1", " 1", "9" * 19, "9" * 4301):
        refused = requester.client.get("/api/v2/status/models", {"type": "text", "min_count": bad})
        assert (refused.status_code, refused.json()["rc"]) == (400, "BadRequest"), bad
        refused = requester.client.get("/api/v2/status/models", {"type": "text", "max_count": bad})
        assert refused.status_code == 400, bad


def test_a_model_whose_worker_is_in_maintenance_is_not_counted(requester, owner):
    owner.pop("resting", models=["m9"])
    Worker.objects.filter(name="resting").update(maintenance=True)
    assert requester.client.get("/api/v2/status/models?type=text").json() == []


def test_status_models_is_cached_for_two_seconds_as_on_the_ai_horde(requester, owner):
    owner.pop("early", models=["m1"])
    first = requester.client.get("/api/v2/status/models?type=text").json()
    owner.pop("late", models=["m-new"])
    assert requester.client.get("/api/v2/status/models?type=text").json() == first
    cache.delete(discovery.MODELS_KEY)
    assert {m["name"] for m in requester.client.get("/api/v2/status/models?type=text").json()} == {
        "m1",
        "m-new",
    }


def test_performance_counts_the_online_text_workers_and_the_waiting_work(requester, owner):
    owner.pop("p1", threads=3)
    owner.pop("p2")
    requester.request_text(params={"max_length": 64, "n": 2})
    job = owner.pop("p2").json()
    owner.submit(job["id"], "z" * 400)
    load = requester.client.get("/api/v2/status/performance").json()
    assert (load["text_worker_count"], load["text_thread_count"]) == (2, 4)
    assert (load["queued_text_requests"], load["queued_tokens"]) == (1, 64.0)
    assert load["past_minute_tokens"] == 64.0
    assert (load["worker_count"], load["queued_megapixelsteps"], load["interrogator_count"]) == (0, 0.0, 0)


def test_modes_are_all_off(requester):
    assert requester.client.get("/api/v2/status/modes").json() == {
        "maintenance_mode": False,
        "invite_only_mode": False,
        "raid_mode": False,
    }


def test_text_statistics_count_accepted_generations_per_period_and_model(requester, owner):
    owner.pop("s", models=["m1", "m2"])
    for model, length in (("m1", 30), ("m1", 40), ("m2", 50)):
        requester.request_text(models=[model], params={"max_length": length})
        job = owner.pop("s", models=["m1", "m2"]).json()
        owner.submit(job["id"], "w" * 400)
    totals = requester.client.get("/api/v2/stats/text/totals").json()
    assert totals == {
        period: {"requests": 3, "tokens": 120} for period in ("minute", "hour", "day", "month", "total")
    }
    per_model = requester.client.get("/api/v2/stats/text/models").json()
    assert per_model == {period: {"m1": 2, "m2": 1} for period in ("day", "month", "total")}
