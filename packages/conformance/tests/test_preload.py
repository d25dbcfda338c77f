"""What the ranks' fork server imports: the worker and torch's optimizer machinery
first, a strategy's modules, what `preload` named, and the freeze last."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from plait.conformance import pool, preload
from plait.core import ConfigurationError


@pytest.fixture
def restored() -> Iterator[None]:
    saved = list(pool._preloaded)
    yield
    pool._preloaded[:] = saved


@pytest.mark.usefixtures("restored")
def test_named_modules_come_after_the_strategys_and_before_the_freeze_once_each() -> None:
    preload("json", "email.message")
    preload("json")

    modules = pool.fork_server_modules("plait.strategies.ddp")

    assert modules[: len(pool.RANK_MODULES)] == list(pool.RANK_MODULES)
    assert "torch._dynamo" in pool.RANK_MODULES
    assert modules[len(pool.RANK_MODULES)] == "plait.strategies.ddp"
    assert modules[-3:] == ["json", "email.message", "plait.conformance.frozen"]
    assert modules.count("json") == 1


@pytest.mark.usefixtures("restored")
@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("deepspeed-zero", "preload: 'deepspeed-zero' is not a module name"),
        ("", "preload: '' is not a module name"),
        ("json.no_such_part", "preload: no module 'json.no_such_part' can be imported here"),
        ("no_such_package.part", "preload: no module 'no_such_package.part' can be imported"),
    ],
)
def test_a_name_that_is_no_module_is_refused_naming_it_and_nothing_is_kept(
    module: str, message: str
) -> None:
    before = pool.fork_server_modules()

    with pytest.raises(ConfigurationError, match=message) as raised:
        preload(module)

    assert raised.value.value == module
    assert pool.fork_server_modules() == before
