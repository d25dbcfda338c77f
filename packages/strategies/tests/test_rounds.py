"""The job's stores: ranks restarted by torchrun agree on a round of their own, whatever an
earlier one left; rank 0 serves the group's store on a port no one can take from it."""

import socket
import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from plait.core import (
    CollectiveTimeoutError,
    free_port,
    listening_socket,
    release_reserved,
    reserve_port,
    take_reserved,
)
from plait.environments import LocalEnvironment
from plait.strategies import process_group


def served() -> dist.TCPStore:
    """A job's store, as torchrun's agent serves it."""
    return dist.TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False)


def agree(server: dist.TCPStore, world_size: int, timeout: float = 30) -> list[int]:
    """Every rank's round, each rank a thread with a connection of its own."""
    numbers: dict[int, int] = {}

    def rank(number: int) -> None:
        client = dist.TCPStore("127.0.0.1", server.port, is_master=False)
        numbers[number] = process_group._agree_on_round(
            client, number, world_size, timedelta(seconds=timeout)
        )

    threads = [threading.Thread(target=rank, args=(each,)) for each in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 10)
    return [numbers[each] for each in range(world_size)]


def test_each_attempt_gets_a_new_round_shared_by_every_rank() -> None:
    store = served()

    first = agree(store, 3)
    second = agree(store, 3)  # a restarted attempt, on the same store

    assert len(set(first)) == 1
    assert len(set(second)) == 1
    assert second[0] > first[0]


def test_what_an_earlier_attempt_left_is_not_taken_for_this_ones() -> None:
    store = served()
    # A dead attempt's question, already answered, and its rank 0's round.
    store.set("plait/hello/1", "old")
    store.set("plait/welcome/1/old", "7")
    store.set("plait/rounds", "7")

    numbers = agree(store, 2)

    assert numbers == [8, 8]


def test_a_rank_that_never_asks_is_named() -> None:
    store = served()

    with pytest.raises(CollectiveTimeoutError, match="ranks 1 did not arrive"):
        process_group._agree_on_round(store, 0, 2, timedelta(seconds=1))


def test_rank_0_serves_the_group_store_on_the_socket_it_bound_before_naming_the_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A port probed, closed and bound again later could be taken in between: rank 0
    # must never probe for it.
    def probed(host: str = "127.0.0.1") -> int:
        raise AssertionError("the group store's port was probed, not bound")

    monkeypatch.setattr(process_group, "free_port", probed, raising=False)
    environment = LocalEnvironment(
        main_address="127.0.0.1",
        main_port=1,
        world_size=2,
        global_rank=0,
        local_rank=0,
        node_rank=0,
    )
    job_store = dist.HashStore()

    group_store = process_group._group_store(environment, job_store, timedelta(seconds=10))

    port = int(job_store.get(process_group._GROUP_STORE_KEY))
    assert group_store.port == port
    with socket.socket() as intruder, pytest.raises(OSError, match="in use"):
        intruder.bind(("127.0.0.1", port))  # the port was the store's from the start
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    client.set("from rank 1", "hello")
    assert group_store.get("from rank 1") == b"hello"


def test_a_listening_socket_holds_its_port_until_handed_over() -> None:
    listener = listening_socket("127.0.0.1")
    port = int(listener.getsockname()[1])

    with socket.socket() as intruder:
        intruder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with pytest.raises(OSError, match="in use"):
            intruder.bind(("127.0.0.1", port))
    store = dist.TCPStore(
        "127.0.0.1",
        port,
        is_master=True,
        wait_for_workers=False,
        master_listen_fd=listener.detach(),
    )
    store.set("key", "value")
    assert dist.TCPStore("127.0.0.1", port, is_master=False).get("key") == b"value"


def test_the_port_a_launcher_reserved_is_served_by_rank_0_from_the_socket_it_held() -> None:
    port = reserve_port("127.0.0.1")  # as the ddp launcher does before starting ranks
    with socket.socket() as intruder:
        intruder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with pytest.raises(OSError, match="in use"):
            intruder.bind(("127.0.0.1", port))  # held from the moment it was chosen
    environment = LocalEnvironment(
        main_address="127.0.0.1",
        main_port=port,
        world_size=1,
        global_rank=0,
        local_rank=0,
        node_rank=0,
    )

    store = process_group._tcp_store(environment, port, timedelta(seconds=10))

    assert take_reserved(port) is None  # handed over, once
    store.set("key", "value")
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    assert client.get("key") == b"value"


def test_a_reservation_no_store_took_is_released() -> None:
    port = reserve_port("127.0.0.1")

    release_reserved(port)

    assert take_reserved(port) is None
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", port))  # free again
