"""DeepSpeedStrategy's options and configuration, checked when the strategy is made.

Every refusal names the bad value and a fix; nothing here joins a process group.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import time
import warnings
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from plait.core import CheckpointError, ConfigurationError, StrategyRegistry
from plait.strategies import DeepSpeedStrategy
from plait.strategies.deepspeed import DeepSpeedFormat, consolidate_checkpoint, library
from plait.strategies.deepspeed.checkpoint_io import (
    _next_tag,
    client_entries,
    client_state_of,
    latest_tag,
)
from plait.strategies.deepspeed.config import (
    KNOWN_KEYS,
    check_supported,
    declared_keys,
    merge_config,
    read_config,
    sized_buckets,
)
from plait.strategies.deepspeed.strategy import _cast_floating


def _made(**options: object) -> DeepSpeedStrategy:
    return DeepSpeedStrategy(accelerator="cpu", **options)  # type: ignore[arg-type]


def test_the_deepspeed_family_is_registered_with_descriptions() -> None:
    expected = {
        "deepspeed": (2, False, False),
        "deepspeed_stage_1": (1, False, False),
        "deepspeed_stage_2": (2, False, False),
        "deepspeed_stage_2_offload": (2, True, False),
        "deepspeed_stage_3": (3, False, False),
        "deepspeed_stage_3_offload": (3, True, True),
    }
    for name, (stage, offload_optimizer, offload_parameters) in expected.items():
        assert StrategyRegistry.entry(name).description
        strategy = StrategyRegistry.get(name, accelerator="cpu")
        assert isinstance(strategy, DeepSpeedStrategy)
        assert (strategy.stage, strategy.offload_optimizer, strategy.offload_parameters) == (
            stage,
            offload_optimizer,
            offload_parameters,
        )


def test_without_deepspeed_choosing_it_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(library, "is_available", lambda: False)

    with pytest.raises(ConfigurationError, match=r"plait-strategies\[deepspeed\]"):
        StrategyRegistry.get("deepspeed_stage_2", accelerator="cpu")
    with pytest.raises(ConfigurationError, match=r"pip install 'plait-strategies\[deepspeed\]'"):
        _made()


_FIRST_IMPORT = """
import importlib.util, sys
import plait.strategies, plait.strategies.deepspeed
from plait.core import StrategyRegistry
from plait.strategies.deepspeed import library

StrategyRegistry.get('deepspeed_stage_3', accelerator='cpu')
assert 'deepspeed' not in sys.modules, 'deepspeed was imported'

library.import_deepspeed('cpu')
from deepspeed.autotuning import autotuner
assert not autotuner.has_mlflow
if importlib.util.find_spec('mlflow') is not None:  # installed, and hidden from deepspeed
    assert 'mlflow' not in sys.modules, 'mlflow was imported with deepspeed'
    import mlflow  # the user's own import, as usual
    print('mlflow', mlflow.__name__)
"""


def test_deepspeed_is_imported_when_used_without_what_only_its_autotuner_needs() -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    result = subprocess.run(
        [sys.executable, "-c", _FIRST_IMPORT], capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert library.UNUSED_IMPORTS == ("mlflow",)
    if importlib.util.find_spec("mlflow") is not None:
        assert "mlflow mlflow" in result.stdout


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stage": 4}, r"invalid stage: 4"),
        ({"stage": True}, r"invalid stage: True"),
        ({"stage": 2, "offload_parameters": True}, r"stage 3 only, and the stage is 2"),
        ({"stage": 0, "offload_optimizer": True}, r"stages 1-3 only, and the stage is 0"),
        ({"offload_optimizer": "yes"}, r"offload_optimizer='yes' must be True or False"),
        ({"precision": "16-mixed"}, r"fp16 on GPUs only"),
        ({"precision": "64-true"}, r"computes in float64"),
        ({"checkpoint_io": "torch"}, r"engine writes its checkpoints"),
        ({"logging_level": "INFO"}, r"logging_level='INFO' must be a logging level"),
        ({"start_method": "spwan"}, r"invalid start_method: 'spwan'"),
        ({"config": {"bf16": {"enabled": True}, "fp16": {"enabled": True}}}, r"both bf16 and fp16"),
        ({"config": 3}, r"dict or the path of a JSON file"),
        ({"config": {"zero_optimization": {"stage": 5}}}, r"invalid ZeRO stage: 5"),
    ],
)
def test_bad_options_are_refused_when_the_strategy_is_made(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        _made(**options)
    assert "fix:" in str(caught.value) or "did you mean" in str(caught.value)


def test_a_user_config_is_kept_and_completed_by_plaits_settings() -> None:
    strategy = _made(
        config={
            "zero_optimization": {"stage": 3, "reduce_bucket_size": 1000},
            "gradient_clipping": 0.5,
            "steps_per_print": 7,
        }
    )
    config = strategy.config
    assert strategy.stage == 3
    assert config["zero_optimization"] == {"stage": 3, "reduce_bucket_size": 1000}
    assert config["gradient_clipping"] == 0.5
    assert config["steps_per_print"] == 7
    # What plait derives: accumulation is its own, a micro-batch size DeepSpeed needs.
    assert config["gradient_accumulation_steps"] == 1
    assert config["managed_gradient_accumulation"] is False
    assert config["train_micro_batch_size_per_gpu"] == 1
    assert config["zero_force_ds_cpu_optimizer"] is False


def test_deepspeed_does_not_clip_unless_asked() -> None:
    # DeepSpeed's own default is to clip the gradients' norm to 1.0.
    assert _made().config["gradient_clipping"] == 0.0


def test_the_precision_maps_onto_deepspeeds() -> None:
    bf16 = _made(precision="bf16-mixed")
    assert bf16.config["bf16"] == {"enabled": True}
    assert bf16.config["fp16"] == {"enabled": False}
    assert (bf16.precision_name, bf16.compute_dtype) == ("bf16", torch.bfloat16)
    assert _made(precision="bf16-true").precision_name == "bf16"
    fp32 = _made(precision="32-true")
    assert fp32.config["bf16"] == {"enabled": False}
    assert fp32.compute_dtype == torch.float32
    # No precision given: the config's is used.
    assert _made(config={"bf16": {"enabled": True}}).precision_name == "bf16"


@pytest.mark.parametrize(
    ("options", "path", "config_value", "plait_value"),
    [
        ({"stage": 3, "config": {"zero_optimization": {"stage": 2}}},
         "zero_optimization.stage", "2", "3"),
        ({"precision": "32-true", "config": {"bf16": {"enabled": True}}},
         "bf16.enabled", "True", "False"),
        ({"config": {"gradient_accumulation_steps": 4}},
         "gradient_accumulation_steps", "4", "1"),
        ({"stage": 3, "offload_parameters": True,
          "config": {"zero_optimization": {"offload_param": {"device": "nvme"}}}},
         "zero_optimization.offload_param.device", "'nvme'", "'cpu'"),
    ],
)  # fmt: skip
def test_a_conflict_with_plaits_settings_names_both_values(
    options: dict[str, object], path: str, config_value: str, plait_value: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        _made(**options)
    message = str(caught.value)
    assert f"conflict at {path!r}" in message
    assert f"the config says {config_value}" in message
    assert f"plait requires {plait_value}" in message


def test_accumulating_in_the_config_points_to_the_trainers_setting() -> None:
    with pytest.raises(ConfigurationError, match=r"accumulate_grad_batches"):
        _made(config={"gradient_accumulation_steps": 8})


def test_unknown_config_keys_are_reported_with_the_closest_known_one() -> None:
    with pytest.raises(ConfigurationError) as caught:
        _made(config={"zero_optimisation": {"stage": 2}, "fp16": {"enabled": False}, "x": 1})
    message = str(caught.value)
    assert "'zero_optimisation' (did you mean 'zero_optimization'?)" in message
    assert "'x'" in message
    assert "fp16" not in message.split("read:")[1]


def test_a_json_config_file_is_read_and_its_errors_located(tmp_path: Path) -> None:
    good = tmp_path / "ds.json"
    good.write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    assert _made(config=good).stage == 1
    assert _made(config=str(good)).stage == 1

    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "zero_optimization": {"stage": 1},\n}\n')
    with pytest.raises(ConfigurationError, match=r"not valid JSON: .* at line 3, column 1"):
        read_config(bad)
    with pytest.raises(ConfigurationError, match=r"no such file"):
        read_config(tmp_path / "missing.json")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ConfigurationError, match=r"is a list, not a JSON object"):
        read_config(listed)


def test_merging_fills_defaults_only_where_the_user_said_nothing() -> None:
    merged = merge_config(
        {"a": {"x": 1}, "b": 2},
        required={"c": 3},
        defaults={"a": {"x": 9, "y": 4}, "b": 7, "d": 5},
    )
    assert merged == {"a": {"x": 1, "y": 4}, "b": 2, "c": 3, "d": 5}
    # A required bool is not satisfied by an equal int.
    with pytest.raises(ConfigurationError, match=r"conflict at 'flag'"):
        merge_config({"flag": 0}, required={"flag": False}, defaults={})


def test_the_installed_deepspeed_declares_what_plait_relies_on() -> None:
    declared = declared_keys()
    assert {"managed_gradient_accumulation", "gradient_clipping", "zero_optimization"} <= (
        declared | KNOWN_KEYS
    )
    check_supported(declared)
    with pytest.raises(ConfigurationError, match=r"no 'managed_gradient_accumulation'"):
        check_supported(frozenset({"gradient_clipping"}))


def test_gradient_clipping_by_value_or_against_the_config_is_refused() -> None:
    strategy = _made()
    module = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    with pytest.raises(ConfigurationError, match=r"by their norm, and the algorithm is 'value'"):
        strategy.clip_gradients(module, optimizer, 1.0, algorithm="value")
    configured = _made(config={"gradient_clipping": 0.5})
    with pytest.raises(ConfigurationError, match=r"the config says 0.5, and the clipping asked"):
        configured.clip_gradients(module, optimizer, 1.0)


def test_the_engine_takes_one_optimizer_of_the_modules_and_none_from_the_config_too() -> None:
    strategy = _made()
    module = torch.nn.Linear(2, 2)
    first = torch.optim.SGD(module.parameters(), lr=0.1)
    second = torch.optim.SGD(module.parameters(), lr=0.2)
    with pytest.raises(ConfigurationError, match=r"drives one optimizer, and 2 were given"):
        strategy.setup_module_and_optimizers(module, [first, second])
    other = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(ConfigurationError, match=r"not the module's"):
        strategy.setup_module_and_optimizers(module, [other])
    configured = _made(config={"optimizer": {"type": "AdamW", "params": {"lr": 0.1}}})
    with pytest.raises(ConfigurationError, match=r"the DeepSpeed config makes one too"):
        configured.setup_module_and_optimizers(module, [first])
    with pytest.raises(ConfigurationError, match=r"has not joined"):
        strategy.setup_module_and_optimizers(module, [first])
    with pytest.raises(ConfigurationError, match=r"no DeepSpeed engine"):
        strategy.backward(torch.tensor(1.0, requires_grad=True))


def test_building_partitioned_needs_the_process_group_and_only_stage_3_partitions() -> None:
    with _made(stage=2).model_sharded_context():
        layer = torch.nn.Linear(2, 2)
    assert layer.weight.shape == (2, 2)
    with pytest.raises(ConfigurationError, match=r"setup_environment"):  # noqa: SIM117
        with _made(stage=3).model_sharded_context():
            pass


def test_floating_inputs_follow_the_engines_dtype_and_keep_their_structure() -> None:
    Pair = namedtuple("Pair", ["x", "index"])
    data = {"pair": Pair(torch.ones(2), torch.arange(2)), "rest": [torch.zeros(1), "text"]}
    cast = _cast_floating(data, torch.bfloat16)
    assert isinstance(cast, dict)
    assert isinstance(cast["pair"], Pair)
    assert cast["pair"].x.dtype == torch.bfloat16
    assert cast["pair"].index.dtype == torch.int64
    assert cast["rest"][0].dtype == torch.bfloat16
    assert cast["rest"][1] == "text"


def test_a_stale_extensions_lock_is_named_or_removed_and_a_fresh_one_left(tmp_path: Path) -> None:
    build = tmp_path / "py311_cpu" / "cpu_adam"
    build.mkdir(parents=True)
    lock = build / "lock"
    lock.touch()
    assert library.check_extension_locks(tmp_path) == []  # a build may be under way
    old = time.time() - 3600
    os.utime(lock, (old, old))
    with pytest.raises(ConfigurationError) as caught:
        library.check_extension_locks(tmp_path)
    assert str(lock) in str(caught.value)
    assert "60 minutes ago" in str(caught.value)
    assert "TORCH_EXTENSIONS_DIR" in str(caught.value)
    assert library.check_extension_locks(tmp_path, remove=True) == [lock]
    assert not lock.exists()


def test_the_extensions_directory_follows_torch_extensions_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert library.extensions_dir() == tmp_path
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert library.extensions_dir() == tmp_path / "cache" / "torch_extensions"


def test_deepspeed_builds_no_shared_memory_op() -> None:
    library.import_deepspeed("cpu")
    backend = library.import_submodule("comm.torch")
    assert backend.build_shm_op() is None


def test_deepspeed_imported_first_by_the_users_code_still_builds_no_shared_memory_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    library.import_deepspeed("cpu")
    backend = library.import_submodule("comm.torch")
    monkeypatch.setattr(backend, "build_shm_op", lambda: "built")  # DeepSpeed's own, as imported

    library.import_deepspeed("cpu")  # deepspeed is imported already

    assert backend.build_shm_op() is None


def test_checkpoint_directories_are_recognised_and_their_tags_checked(tmp_path: Path) -> None:
    assert not DeepSpeedFormat().recognizes(tmp_path)
    assert _next_tag(tmp_path / "none") == "checkpoint-1"
    (tmp_path / "checkpoint-1").mkdir()
    (tmp_path / "checkpoint-7").mkdir()
    assert _next_tag(tmp_path) == "checkpoint-8"
    (tmp_path / "latest").write_text("checkpoint-9")
    assert DeepSpeedFormat().recognizes(tmp_path)
    with pytest.raises(CheckpointError, match=r"names the tag 'checkpoint-9'"):
        latest_tag(tmp_path)
    (tmp_path / "latest").write_text("checkpoint-7\n")
    assert latest_tag(tmp_path) == "checkpoint-7"
    with pytest.raises(CheckpointError, match=r"not a DeepSpeed checkpoint"):
        latest_tag(tmp_path / "elsewhere")


def test_a_deepspeed_checkpoint_is_loaded_after_set_up_and_saved_to_a_directory(
    tmp_path: Path,
) -> None:
    (tmp_path / "checkpoint-1").mkdir()
    (tmp_path / "latest").write_text("checkpoint-1")
    strategy = _made()
    with pytest.raises(CheckpointError, match=r"loads after set-up"):
        strategy.load_checkpoint(tmp_path)
    file = tmp_path / "file.ckpt"
    file.write_text("")
    with pytest.raises(CheckpointError, match=r"is a file, and a DeepSpeed checkpoint is a dir"):
        strategy.save_checkpoint({"epoch": 1}, file)
    with pytest.raises(CheckpointError, match=r"has no model-states file in 'checkpoint-1'"):
        consolidate_checkpoint(tmp_path, tmp_path / "out.pt")
    # With optimizers, the engine saves the state: nothing is gathered for it.
    module = torch.nn.Linear(2, 2)
    state = strategy.get_state_dict(module, [torch.optim.SGD(module.parameters(), lr=0.1)])
    assert state["state_dict"] == {}
    assert state["optimizer_states"] == []


def test_only_the_notices_torch_gives_deepspeeds_own_calls_are_hidden_and_only_inside() -> None:
    notice = "`torch.distributed.all_gather_into_tensor` is deprecated. Please use ..."
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with library.quiet():
            warnings.warn(notice, FutureWarning, stacklevel=1)
            warnings.warn("the user's own", FutureWarning, stacklevel=1)
            warnings.warn(
                "`torch.distributed.all_gather_into_tensor` is deprecated",
                UserWarning,
                stacklevel=1,
            )
        warnings.warn(notice, FutureWarning, stacklevel=1)  # outside plait's calls: shown

    assert [(w.category, str(w.message)) for w in shown] == [
        (FutureWarning, "the user's own"),
        (UserWarning, "`torch.distributed.all_gather_into_tensor` is deprecated"),
        (FutureWarning, notice),
    ]


@pytest.mark.parametrize(
    ("stage", "sized"),
    [
        (1, {"reduce_bucket_size", "allgather_bucket_size"}),
        (2, {"reduce_bucket_size", "allgather_bucket_size"}),
        (3, {"reduce_bucket_size", "stage3_prefetch_bucket_size"}),
    ],
)
def test_buckets_are_sized_from_the_model_unless_the_config_sets_them(
    stage: int, sized: set[str]
) -> None:
    # A bucket is allocated whole (and filled, in deterministic mode): no larger than
    # the model, rounded up to DeepSpeed's alignment.
    config = _made(stage=stage).config
    made = sized_buckets(config, {}, elements=75_000)
    zero = made["zero_optimization"]
    assert isinstance(zero, dict)
    assert {key: zero[key] for key in sized} == dict.fromkeys(sized, 75_776)
    # A large model keeps DeepSpeed's defaults.
    large = sized_buckets(config, {}, elements=10**10)["zero_optimization"]
    assert isinstance(large, dict)
    assert large["reduce_bucket_size"] == 500_000_000
    # A size the user gives always wins, in either of DeepSpeed's spellings.
    user = {"zero_optimization": {"reduce_bucket_size": 12, "allgather_size": 34}}
    kept = sized_buckets({**config, **user}, user, elements=75_000)["zero_optimization"]
    assert isinstance(kept, dict)
    assert kept["reduce_bucket_size"] == 12
    assert "allgather_bucket_size" not in kept
    # The strategy's own config is left as it was made.
    assert "reduce_bucket_size" not in config["zero_optimization"]  # type: ignore[operator]


def test_a_stage_without_buckets_is_left_alone() -> None:
    config = {"zero_optimization": {"stage": 0}}
    assert sized_buckets(config, {}, elements=10) == config


def test_lightnings_config_path_variable_is_read_when_no_config_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    monkeypatch.setenv("PL_DEEPSPEED_CONFIG_PATH", str(path))

    assert _made().stage == 1
    assert _made(config={"zero_optimization": {"stage": 3}}).stage == 3  # given wins


def test_offload_devices_buffers_and_activation_checkpointing_reach_the_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    strategy = _made(
        stage=3,
        offload_optimizer=True,
        offload_parameters=True,
        partition_activations=True,
        cpu_checkpointing=True,
    )
    zero = strategy.config["zero_optimization"]
    assert isinstance(zero, dict)
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": False}
    assert strategy.config["activation_checkpointing"] == {
        "partition_activations": True,
        "cpu_checkpointing": True,
    }
    # NVMe: the path and buffer counts go with it (the op itself is checked apart).
    monkeypatch.setattr(library, "require_async_io", lambda: None)
    nvme = _made(
        stage=3,
        offload_parameters=True,
        offload_params_device="nvme",
        nvme_path="/scratch/nvme",
        params_buffer_count=8,
    )
    zero = nvme.config["zero_optimization"]
    assert isinstance(zero, dict)
    assert zero["offload_param"] == {
        "device": "nvme",
        "pin_memory": False,
        "nvme_path": "/scratch/nvme",
        "buffer_count": 8,
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"offload_params_device": "disk"}, "invalid offload_params_device: 'disk'"),
        ({"optimizer_buffer_count": 0}, "optimizer_buffer_count=0 must be an int of at least 1"),
        ({"partition_activations": "yes"}, "partition_activations='yes' must be True or False"),
        ({"exclude_frozen_parameters": 1}, "exclude_frozen_parameters=1 must be True or False"),
    ],
)
def test_bad_deepspeed_options_of_lightning_are_refused(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        _made(**options)


def test_nvme_offload_without_deepspeeds_async_io_op_is_refused_naming_libaio() -> None:
    try:
        library.require_async_io()
    except ConfigurationError:
        pass
    else:
        pytest.skip("this machine can build DeepSpeed's async_io op")
    with pytest.raises(ConfigurationError, match="async_io op") as caught:
        _made(stage=3, offload_optimizer=True, offload_optimizer_device="nvme")
    assert caught.value.fix is not None
    assert "libaio" in caught.value.fix


def test_a_client_entry_named_as_one_of_the_engines_is_kept_apart_with_a_warning() -> None:
    checkpoint = {"state_dict": {}, "optimizer_states": [], "global_steps": 7, "epoch": 2}

    with pytest.warns(UserWarning, match=r"\['global_steps'\] are named as entries DeepSpeed"):
        client = client_state_of(checkpoint)

    assert "global_steps" not in client  # the engine's own stays the engine's
    saved = {**client, "global_steps": 123, "module": {}}  # what the engine writes beside
    assert client_entries(saved) == {"global_steps": 7, "epoch": 2}


def test_devices_other_than_the_local_ranks_are_refused_as_in_lightning() -> None:
    # The engine puts each process on the device of its local rank, whatever it is given.
    with pytest.raises(ConfigurationError, match=r"CUDA_VISIBLE_DEVICES=1,3 and pass devices=2"):
        DeepSpeedStrategy(
            accelerator="cuda", parallel_devices=[torch.device("cuda", 1), torch.device("cuda", 3)]
        )
    made = DeepSpeedStrategy(
        accelerator="cuda", parallel_devices=[torch.device("cuda", 0), torch.device("cuda", 1)]
    )
    assert made.parallel_devices == [torch.device("cuda", 0), torch.device("cuda", 1)]
