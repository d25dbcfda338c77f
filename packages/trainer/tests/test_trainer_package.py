import importlib.metadata

from packaging.requirements import Requirement

import plait.trainer

PARTS = {"accelerators", "precision", "checkpoint_io", "environments", "strategies"}


def test_the_trainer_depends_on_core_and_every_part_it_composes() -> None:
    required = {
        Requirement(text).name for text in importlib.metadata.requires("plait-trainer") or []
    }

    assert plait.trainer.__doc__
    assert required >= {"plait-core"} | {"plait-" + part.replace("_", "-") for part in PARTS}
