"""Several processes calling the LLM at once (issue 59): one call per key whichever process
asks, an automation run's call cap held across its step processes, and a dead sender's
leases lapse. Real processes (spawned) and a real HTTP server answering from a script."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from bridge_assets.llm import coordination
from bridge_assets.llm.client import LLMClient
from bridge_assets.llm.ledger import read_calls
from fixtures import concurrent_calls
from fixtures.paths import location
from fixtures.scripted_llm import ScriptedServer, completion, http_profile

SPAWN = multiprocessing.get_context("spawn")


def yes(delay: float):
    return lambda index, body: (200, completion('{"response": "yes"}'), delay)


def test_two_processes_asking_the_same_50_keys_send_each_once(data_lake):
    texts = [f"question {i}" for i in range(50)]
    with ScriptedServer(yes(0.1)) as server:
        start, out = SPAWN.Event(), SPAWN.Queue()
        # the second asks in the opposite order, so the two claim chunks from both ends
        workers = [SPAWN.Process(target=concurrent_calls.ask_together, args=(server.url, order, start, out, 8))
                   for order in (texts, texts[::-1])]
        for worker in workers:
            worker.start()
        start.set()
        answers = [out.get(timeout=120) for _ in workers]
        for worker in workers:
            worker.join(timeout=30)
        assert server.hits == 50                       # each key sent once, by one of the two
    for answered, _sent, _read in answers:             # both got every reply
        assert sorted(answered) == sorted(texts)
    assert sum(sent for _answered, sent, _read in answers) == 50
    assert all(sent > 0 for _answered, sent, _read in answers)  # the work was shared, not serialized
    calls = read_calls(location())
    assert calls.height == 50 and calls["key"].n_unique() == 50
    assert coordination.for_store(location()).held(calls["key"].to_list()) == set()  # nothing left leased


def test_a_call_cap_shared_by_two_processes_is_never_exceeded_in_20_races(data_lake):
    rounds, cap = 20, 2
    with ScriptedServer(yes(0.0)) as server:
        barrier, out = SPAWN.Barrier(2), SPAWN.Queue()
        workers = [SPAWN.Process(target=concurrent_calls.race_capped, args=(server.url, n, rounds, cap, barrier, out))
                   for n in range(2)]
        for worker in workers:
            worker.start()
        sent = dict(out.get(timeout=180) for _ in workers)
        for worker in workers:
            worker.join(timeout=30)
        assert server.hits == rounds * cap
    per_round = [a + b for a, b in zip(sent[0], sent[1])]
    assert per_round == [cap] * rounds   # 6 calls wanted each round, 2 sent, by either worker
    counts = read_calls(location()).group_by("context").len()
    assert sorted(counts["len"].to_list()) == [cap] * rounds
    assert coordination.for_store(location()).calls_reserved("race-0") == cap


def test_a_killed_senders_leases_lapse_and_another_process_sends_its_calls(data_lake, monkeypatch):
    monkeypatch.setenv("BRIDGE_LEASE_SECONDS", "2")
    with ScriptedServer(yes(0.0)) as server:
        client = LLMClient(http_profile(server.url))
        asked = concurrent_calls.questions(client, ["a", "b", "c"])
        keys = [client.key(request) for request in asked]
        ready = SPAWN.Event()
        holder = SPAWN.Process(target=concurrent_calls.hold_and_hang, args=(keys, ready))
        holder.start()
        assert ready.wait(60)
        assert coordination.for_store(location()).held(keys) == set(keys)
        os.kill(holder.pid, signal.SIGKILL)
        holder.join()
        started = time.monotonic()
        results = client.generate(asked)
        waited = time.monotonic() - started
        assert [r.parsed for r in results] == [{"response": "yes"}] * 3
        assert server.hits == 3 and client.stats.calls == 3
    assert 0.5 < waited < 30  # it waited for the lease to lapse, then sent the calls itself


def test_a_lease_is_renewed_while_its_holder_lives(data_lake, monkeypatch):
    shared = coordination.for_store(location())
    with coordination.Leases(shared, ttl=1) as leases:
        assert leases.claim(["k1", "k2"]) == (["k1", "k2"], [], False)
        time.sleep(1.6)  # past the first expiry: the keeper renewed it
        assert shared.held(["k1", "k2"]) == {"k1", "k2"}
        with coordination.Leases(shared, ttl=1) as other:
            assert other.claim(["k2", "k3"]) == (["k3"], ["k2"], False)
            leases.release(["k1"])  # another holder released: what `other` holds may be answered
            assert other.claim(["k4"])[2] is True
            other.release(["k3"])   # its own releases do not count
            assert other.claim(["k3"])[2] is True
        with coordination.Leases(shared, ttl=1) as third:  # enters (reads the ledger) after them
            assert third.claim(["k6"]) == (["k6"], [], False)
    assert shared.held(["k1", "k2", "k3", "k4", "k6"]) == set()  # leaving releases everything


@pytest.mark.parametrize("wanted", [[3], [1, 1, 1], [0, 5]])
def test_reservations_grant_at_most_the_cap(data_lake, wanted):
    shared = coordination.for_store(location())
    granted = [shared.reserve_calls("run", 2, n) for n in wanted]
    assert sum(granted) == min(2, sum(wanted)) and shared.calls_reserved("run") == sum(granted)
