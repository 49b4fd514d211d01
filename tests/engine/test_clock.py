"""engine/clock.py's Anticipation: host work run just before a recurring wait ends."""

import time

from engine.clock import Anticipation

MS = 1_000_000
LEAD_NS = 5 * MS  # a lead a busy test machine's late wake-ups stay within


def _wait(anticipation: Anticipation, wait_ns: int, ran: list[int]) -> None:
    """One wait that ends `wait_ns` after it began, with the work anticipated in it: `ran`
    gets when the work ran, from the wait's start."""
    began_ns = time.monotonic_ns()

    def finished() -> bool:
        return time.monotonic_ns() - began_ns >= wait_ns

    anticipation.run(began_ns, lambda: ran.append(time.monotonic_ns() - began_ns), finished)
    while not finished():  # spun: the end seen at once, as a device step's is
        pass
    anticipation.waited(began_ns)


def test_the_work_runs_just_ahead_of_the_expected_end_of_the_wait() -> None:
    anticipation = Anticipation(LEAD_NS)
    ran: list[int] = []
    _wait(anticipation, 20 * MS, ran)
    assert ran == [], "no wait seen yet: nothing to anticipate"
    _wait(anticipation, 20 * MS, ran)
    (at,) = ran
    assert 20 * MS - LEAD_NS <= at <= 20 * MS, "at its lead before the end, not sooner"


def test_a_wait_that_ends_sooner_skips_the_work_and_moves_the_next_one_in() -> None:
    anticipation = Anticipation(LEAD_NS)
    ran: list[int] = []
    _wait(anticipation, 20 * MS, ran)
    began_ns = time.monotonic_ns()
    _wait(anticipation, 8 * MS, ran)  # the step got faster: the work's moment never came
    assert ran == []
    assert time.monotonic_ns() - began_ns < 12 * MS, "the wait was not held for the work"
    _wait(anticipation, 8 * MS, ran)
    (at,) = ran
    assert 8 * MS - LEAD_NS <= at <= 8 * MS, "ahead of the shorter wait"


def test_the_lead_grows_to_twice_what_the_work_took() -> None:
    anticipation = Anticipation(LEAD_NS)
    ran: list[int] = []
    _wait(anticipation, 20 * MS, ran)
    began_ns = time.monotonic_ns()
    assert anticipation.run(began_ns, lambda: time.sleep(0.004), lambda: False)
    assert anticipation.lead_ns >= 8 * MS
