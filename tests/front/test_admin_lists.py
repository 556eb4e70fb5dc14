"""Every moderator page runs a fixed number of queries, however many rows the horde holds.

The render times at 100,000 generations and 10,000 workers are measured by
bench/admin_lists.py (docs/benchmarks.md), not asserted here.
"""

import pytest

from bench.fill import fill

# Each page's queries: the session, the user, the count, the page of rows (related rows
# joined) and the filters' own (the requests' busiest models); the operations page's counts,
# its queue breakdown (by account, by model, by age) and the admin index.
PAGES = {
    "/admin/": 5,
    "/admin/operations/": 12,
    "/admin/workers/account/": 6,
    "/admin/workers/account/?trusted__exact=1": 6,
    "/admin/workers/worker/": 6,
    "/admin/workers/worker/?maintenance__exact=1": 6,
    "/admin/workers/worker/?capacity=limited": 6,
    "/admin/jobs/textrequest/": 7,
    "/admin/jobs/textrequest/?kind__exact=chat&state__exact=active": 7,
    "/admin/jobs/generation/": 7,
    "/admin/jobs/generation/?lease=live": 7,
    "/admin/jobs/generation/?lease=lapsed": 7,
    "/admin/jobs/generation/?lease=aborted": 7,
    "/admin/jobs/generation/?capacity=over": 7,
    "/admin/jobs/generation/?capacity=limited": 7,
    "/admin/jobs/generation/?p=2": 7,
}


@pytest.mark.parametrize(("page", "queries"), PAGES.items())
def test_each_moderator_page_runs_the_same_queries_at_any_size(
    moderator, page, queries, django_assert_num_queries
):
    fill(accounts=10, workers=150, generations=250, queued=50)
    with django_assert_num_queries(queries):
        assert moderator.get(page).status_code == 200
    fill(accounts=10, workers=150, generations=250, queued=50)  # twice the rows
    with django_assert_num_queries(queries):
        assert moderator.get(page).status_code == 200


def test_the_generation_list_shows_a_full_page_of_the_newest_first(moderator):
    fill(accounts=3, workers=20, generations=250)
    listed = moderator.get("/admin/jobs/generation/").context["cl"].result_list
    assert len(listed) == 100
    popped = [generation.popped_at for generation in listed]
    assert popped == sorted(popped, reverse=True)
