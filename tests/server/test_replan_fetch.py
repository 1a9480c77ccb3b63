"""A replanned request whose new restore source a peer holds fetches it first (issue 12).

With replicas, a lost restore is planned again on the replica that lost it;
when only another replica holds the new source, the plan names `fetch_from`.
`RayCacheLink` must then have the actor fetch the entry (the handover every
first plan gets in `ModelActor.generate`) before the generator sees the new
plan, or the request prefills cold. Driven without a Ray cluster: the link's
own logic, with the loop's inbox and the actor's fetch as recorded calls.
"""

from __future__ import annotations

from engine.actors.model import RayCacheLink
from engine.cache.kinds import RestoreKind
from engine.cache.messages import Orders, Replanned, RestorePlan


class Inbox:
    """The model loop's inbox: calls run when `run` says (the loop thread's turn)."""

    def __init__(self):
        self.queued = []

    def call(self, fn) -> None:
        self.queued.append(fn)

    def run(self) -> None:
        while self.queued:
            self.queued.pop(0)(None)


def _replanned(fetch_from):
    plan = RestorePlan("r1", 7, 300, RestoreKind.ENTRY, replica=1, fetch_from=fetch_from)
    return Replanned(plan, Orders())


def test_a_replanned_source_held_by_a_peer_is_fetched_before_the_request_runs():
    link = RayCacheLink(replica=1, deadline=5.0)
    link.loop, fetches, seen = Inbox(), [], []
    link.fetch = lambda plan, then: fetches.append((plan, then))
    answered = link._fetched(seen.append)

    answered(_replanned(fetch_from=0))
    assert [p.entry_id for p, _ in fetches] == [7] and seen == []  # not before the fetch
    fetches[0][1]()  # the handover is over
    link.loop.run()
    assert [r.plan.entry_id for r in seen] == [7]

    for held_here in (None, 1):  # the source is here (or on disk): no fetch
        seen.clear()
        answered(_replanned(fetch_from=held_here))
        assert len(fetches) == 1 and len(seen) == 1
    answered(Replanned(None, Orders()))  # the manager no longer plans it
    assert len(fetches) == 1 and seen[-1].plan is None
