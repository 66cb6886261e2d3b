# fleet on-host module: the rehearsal vLLM's decisions at config time (the APIServer).
#
# Part of the simulated `vllm serve` (vllm_sim.py). Python 3.8+, standard library only.
#
# ModelConfig, ParallelConfig and SpeculativeConfig as vLLM's create_engine_config builds
# them, failing where vLLM fails (pydantic's ValidationError, its text as pydantic-core
# prints it): a model directory vLLM cannot read, remote code not trusted, a model type
# Transformers does not know, an architecture the registry lacks, max_model_len above the
# model's, a world size larger than the GPUs, a speculative config with unknown keys or no
# num_speculative_tokens, EAGLE-3 for a model type outside the installed allowlist. Before
# them, EngineArgs.__post_init__: with HF_HUB_OFFLINE set, a model path that does not
# exist is taken for a hub repo id (huggingface_hub's error). Then what the decided
# configuration weighs (the weights per GPU, MLA) and the engine's config line.
import os
import re
from typing import Dict, List, Tuple

from fleet.onhost.rehearsal.source_mining import (
    class_fields,
    config_registry,
    registry_architectures,
)
from fleet.onhost.rehearsal.vllm_sim_args import sim_spec_fields
from fleet.onhost.rehearsal.vllm_sim_model import SimModel
from fleet.onhost.rehearsal.vllm_sim_out import Frame, traceback_text
from fleet.onhost.rehearsal.vllm_sim_src import (
    API_SERVER,
    SIM_TRANSFORMERS_MODEL_TYPES,
    sim_aenter,
    sim_api_top,
    sim_config_frames,
    sim_engine_client,
    site_path,
)
from fleet.onhost.rehearsal.vllm_sim_state import GIB, SimExit, SimState
from fleet.onhost.vllm_tree import admits, allowlists, judge_allowlist


def ray_installed() -> bool:
    """Can this interpreter import Ray (vLLM before 0.11.1 picks it by itself)?"""
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def config_error(sim: SimState, what: str, cls: str, message: str, kwargs: str) -> None:
    """A ValueError in a pydantic config's validation, as the APIServer prints it."""
    frames = sim_api_top(sim.src, sim.bin_path) + sim_engine_client(sim.src)
    frames += sim_config_frames(sim.src, what)
    sim.api.stderr(traceback_text(frames, pydantic_error(sim, cls, message, kwargs)) + "\n")
    raise SimExit(1)


def pydantic_minor(sim: SimState) -> str:
    """The pydantic minor vLLM requires (its METADATA), for the errors.pydantic.dev URL."""
    root = os.path.dirname(sim.pkg)
    try:
        names = [n for n in os.listdir(root) if n.startswith("vllm-") and n.endswith(".dist-info")]
        with open(os.path.join(root, names[0], "METADATA"), encoding="utf-8") as fh:
            for line in fh:
                match = re.match(r"Requires-Dist: pydantic\s*>=\s*(\d+)\.(\d+)", line)
                if match:
                    return "%s.%s" % match.groups()
    except (OSError, IndexError):
        pass
    return "2.12"


def pydantic_error(sim: SimState, cls: str, message: str, input_repr: str) -> str:
    """pydantic-core's text of a ValueError raised while validating `cls`
    (input_value truncated to its first 25 and last 24 characters)."""
    if len(input_repr) > 50:
        input_repr = input_repr[:25] + "..." + input_repr[-24:]
    return (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for %s\n"
        "  Value error, %s [type=value_error, input_value=%s, input_type=ArgsKwargs]\n"
        "    For further information visit https://errors.pydantic.dev/%s/v/value_error"
        % (cls, message, input_repr, pydantic_minor(sim))
    )


# huggingface_hub (not vLLM; the release vLLM 0.17's CPU build installs, 0.36.2): the
# true values of HF_HUB_OFFLINE (constants.py ENV_VARS_TRUE_VALUES, TRANSFORMERS_OFFLINE
# counts too), validate_repo_id's checks and texts with the lines of their `raise`
# (utils/_validators.py), and snapshot_download's offline miss (_snapshot_download.py).
SIM_HUB_TRUE = ("1", "ON", "YES", "TRUE")
SIM_HUB_REPO_ID = re.compile(r"^(\b[\w\-.]+\b/)?\b[\w\-.]{1,96}\b$")
SIM_HUB_VALIDATORS = "huggingface_hub/utils/_validators.py"
SIM_HUB_INNER = (114, "        return fn(*args, **kwargs)")
SIM_HUB_VALIDATE = (106, "                validate_repo_id(arg_value)")


def hub_offline(env: Dict[str, str]) -> bool:
    """huggingface_hub.constants.HF_HUB_OFFLINE for this environment."""
    value = env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE")
    return value is not None and value.upper() in SIM_HUB_TRUE


def hub_repo_error(repo_id: str) -> Tuple[List[Frame], str]:
    """What `snapshot_download(repo_id=...)` raises offline for an id that is no
    directory: validate_repo_id's error, or (a valid id) the cache miss."""
    checks = (
        (
            repo_id.count("/") > 1,
            154,
            "Repo id must be in the form 'repo_name' or 'namespace/repo_name': '%s'. Use "
            "`repo_type` argument if needed.",
        ),
        (
            not SIM_HUB_REPO_ID.match(repo_id),
            160,
            "Repo id must use alphanumeric chars, '-', '_' or '.'. The name cannot start or "
            "end with '-' or '.' and the maximum length is 96: '%s'.",
        ),
        ("--" in repo_id or ".." in repo_id, 167, "Cannot have -- or .. in repo_id: '%s'."),
        (repo_id.endswith(".git"), 170, "Repo_id cannot end by '.git': '%s'."),
    )
    validators = site_path(SIM_HUB_VALIDATORS)
    for failed, line, text in checks:
        if failed:
            frames = [
                Frame(validators, SIM_HUB_VALIDATE[0], "_inner_fn", SIM_HUB_VALIDATE[1]),
                Frame(validators, line, "validate_repo_id", "        raise HFValidationError("),
            ]
            return frames, "huggingface_hub.errors.HFValidationError: " + text % repo_id
    frames = [
        Frame(validators, SIM_HUB_INNER[0], "_inner_fn", SIM_HUB_INNER[1]),
        Frame(
            site_path("huggingface_hub/_snapshot_download.py"),
            230,
            "snapshot_download",
            "            raise LocalEntryNotFoundError(",
        ),
    ]
    return frames, (
        "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached "
        "snapshot folder for the specified revision on the local disk and outgoing traffic "
        "has been disabled. To enable repo look-ups and downloads online, pass "
        "'local_files_only=False' as input."
    )


def check_offline_model(sim: SimState) -> None:
    """EngineArgs.__post_init__ (AsyncEngineArgs.from_cli_args, before any config): with
    HF_HUB_OFFLINE set, the installed tree replaces the model by `get_model_path(model)`,
    which hands a path that does not exist to huggingface_hub's snapshot_download as a
    repo id (engine/arg_utils.py; transformers_utils/repo_utils.py from 0.13, config.py
    before). Read from the installed source: a tree without that call goes on."""
    if not hub_offline(sim.env) or os.path.exists(sim.model_path):
        return
    args = ("engine/arg_utils.py",)
    post = sim.src.frame(args, "__post_init__", "= get_model_path(self.model", "get_model_path")
    fetch = None
    for needle in ("snapshot_download(repo_id=", "hf_api().snapshot_download("):
        fetch = sim.src.frame(
            ("transformers_utils/repo_utils.py", "transformers_utils/config.py"),
            "get_model_path",
            needle,
            "snapshot_download",
        )
        if fetch is not None:
            break
    if post is None or fetch is None:
        return
    frames = sim_api_top(sim.src, sim.bin_path)
    frames += sim.src.chain(
        [(API_SERVER, "run_server_worker", "async with build_async_engine_client(", None)]
    )
    aenter = sim_aenter()
    if aenter is not None:
        frames.append(aenter)
    frames += sim.src.chain(
        [
            (API_SERVER, "build_async_engine_client", ".from_cli_args(args)", "from_cli_args"),
            (args, "from_cli_args", "engine_args = cls(", None),
        ]
    )
    # the dataclass's generated __init__ calls __post_init__ on its last line: one line
    # per field after `def __create_fn__` and `def __init__` (CPython's dataclasses)
    fields = class_fields(sim.pkg, args[0], "EngineArgs") or []
    fields += class_fields(sim.pkg, args[0], "AsyncEngineArgs") or []
    frames.append(Frame("<string>", len(fields) + 3, "__init__", ""))
    frames += [post, fetch]
    hub, exc = hub_repo_error(sim.model_path)
    sim.api.stderr(traceback_text(frames + hub, exc) + "\n")
    raise SimExit(1)


def configure(sim: SimState) -> None:
    """ModelConfig (target), ParallelConfig, SpeculativeConfig (drafter), as vLLM's
    create_engine_config builds them, failing where vLLM would."""
    check_offline_model(sim)
    target = SimModel(sim.model_path)
    sim.target = target
    model_kwargs = "ArgsKwargs((), {'model': %r, 'runner': 'auto', 'tokenizer': %r, ...})" % (
        sim.model_path,
        sim.model_path,
    )
    check_model(sim, target, "model", "ModelConfig", model_kwargs)
    sim.target_max_len = target.max_len
    user_len = sim.args.get("max_model_len")
    if user_len is not None and int(user_len) > sim.target_max_len:
        msg = sim.src.message(
            ("config/model.py", "config/__init__.py"),
            "User-specified max_model_len (",
            {
                "max_model_len": int(user_len),
                "max_len_key": "max_position_embeddings",
                "derived_max_model_len": sim.target_max_len,
                "model_max_length": None,
            },
            "User-specified max_model_len (%d) is greater than the derived max_model_len"
            % int(user_len),
        )
        config_error(sim, "model", "ModelConfig", msg, model_kwargs)
    sim.max_model_len = int(user_len) if user_len is not None else sim.target_max_len
    sim.say("arch", (target.arch,))
    sim.say("max_len", (sim.max_model_len,))
    # ParallelConfig: world size against the GPUs of this node (its share of a server
    # across nodes; with Ray, the cluster's). The text is the installed source's:
    # 0.11.1-0.12 "Tensor parallel size (N) cannot be larger than the number of available
    # GPUs (M).", 0.13+ "World size (N) is larger than ... in this node. If this is ..."
    world = sim.tp * sim.pp
    if not sim.nodes.fits():
        msg = sim.src.message(
            ("config/parallel.py",),
            "larger than the number of available GPUs",
            {"world_size": world, "gpu_count": sim.gpu_count},
            "",
        )
        if not msg and not ray_installed():
            # before 0.11.1 vLLM picks Ray by itself for a world above the node's GPUs,
            # and without Ray installed says so
            msg = sim.src.message(
                ("config/parallel.py", "config/__init__.py", "config.py"),
                "Unable to load Ray",
                {"ray_import_err": "No module named 'ray'"},
                "",
            )
        msg = msg or (
            "World size (%d) is larger than the number of available GPUs (%d) in this node."
            % (world, sim.gpu_count)
        )
        config_error(
            sim,
            "parallel",
            "ParallelConfig",
            msg,
            "ArgsKwargs((), {'pipeline_parallel_size': %d, 'tensor_parallel_size': %d, ...})"
            % (sim.pp, sim.tp),
        )
    sim.drafter = None
    sim.k = 0
    sim.method = None
    if sim.spec is not None:
        configure_spec(sim)
    sim.say("chunked", (int(sim.args.get("max_num_batched_tokens") or 8192),))
    sim.say("async_sched", ("enabled" if sim.spec is not None else "disabled",))


def check_model(sim: SimState, model: SimModel, what: str, cls: str, kwargs: str) -> None:
    if not model.exists or not model.config:
        msg = sim.src.message(
            (
                "transformers_utils/config.py",
                "transformers_utils/repo_utils.py",
                "config/model.py",
            ),
            "Invalid repository ID or local directory specified",
            {"model": model.path},
            "Invalid repository ID or local directory specified: %r." % model.path,
        )
        config_error(sim, what, cls, msg, kwargs)
    registry = config_registry(sim.pkg)
    known = model.model_type in registry or model.model_type in SIM_TRANSFORMERS_MODEL_TYPES
    auto_map = model.config.get("auto_map")
    remote = isinstance(auto_map, dict) and "AutoConfig" in auto_map
    if not known and remote and not sim.trust:
        config_error(
            sim,
            what,
            cls,
            "Loading %s requires you to execute the configuration file in that repo on your "
            "local machine. Make sure you have read the code there to avoid malicious use, "
            "then set the option `trust_remote_code=True` to remove this error." % model.path,
            kwargs,
        )
    if not known and not remote:
        config_error(
            sim,
            what,
            cls,
            "The checkpoint you are trying to load has model type `%s` but Transformers does "
            "not recognize this architecture. This could be because of an issue with the "
            "checkpoint, or because your version of Transformers is out of date.\n\nYou can "
            "update Transformers with the command `pip install --upgrade transformers`."
            % model.model_type,
            kwargs,
        )
    archs = registry_architectures(sim.pkg) or []
    if model.arch not in archs:
        shown = "dict_keys(%r)" % archs
        msg = sim.src.message(
            ("model_executor/models/registry.py",),
            " are not supported for now. ",
            {"architectures": model.archs, "all_supported_archs": shown},
            "Model architectures %r are not supported for now. Supported architectures: %s"
            % (model.archs, shown),
        )
        config_error(sim, what, cls, msg, kwargs)


def configure_spec(sim: SimState) -> None:
    spec = sim.spec
    if not isinstance(spec, dict):
        config_error(
            sim, "spec", "SpeculativeConfig", "speculative_config must be a dict", repr(spec)
        )
        return
    fields = sim_spec_fields(sim.pkg) or []
    unknown = [k for k in spec if fields and k not in fields]
    if unknown:
        frames = sim_api_top(sim.src, sim.bin_path) + sim_engine_client(sim.src)
        frames += sim_config_frames(sim.src, "spec")
        errors = []
        for key in unknown:
            value = spec[key]
            shown = repr(value)
            if len(shown) > 50:
                shown = shown[:25] + "..." + shown[-24:]
            errors.append(
                "%s\n  Unexpected keyword argument [type=unexpected_keyword_argument, "
                "input_value=%s, input_type=%s]\n    For further information visit "
                "https://errors.pydantic.dev/%s/v/unexpected_keyword_argument"
                % (key, shown, type(value).__name__, pydantic_minor(sim))
            )
        head = "pydantic_core._pydantic_core.ValidationError: %d validation error%s" % (
            len(errors),
            "" if len(errors) == 1 else "s",
        )
        head += " for SpeculativeConfig"
        sim.api.stderr(traceback_text(frames, head + "\n" + "\n".join(errors)) + "\n")
        raise SimExit(1)
    kwargs = (
        "ArgsKwargs((), {%s, 'target_model_config': ModelConfig(...), "
        "'target_parallel_config': ParallelConfig(...)})"
        % (", ".join("%r: %r" % (k, v) for k, v in spec.items()))
    )
    method = spec.get("method")
    drafter_path = spec.get("model")
    if method is None and drafter_path and "eagle3" in str(drafter_path).lower():
        method = "eagle3"
    sim.method = method
    if drafter_path and not spec.get("num_speculative_tokens"):
        msg = sim.src.message(
            ("config/speculative.py", "config/__init__.py"),
            "num_speculative_tokens",
            {},
            "num_speculative_tokens must be provided with speculative model unless the "
            "draft model config contains an n_predict parameter.",
        )
        config_error(sim, "spec", "SpeculativeConfig", msg, kwargs)
    sim.k = int(spec.get("num_speculative_tokens") or 0)
    if not drafter_path:
        return
    drafter = SimModel(str(drafter_path))
    sim.drafter = drafter
    check_model(sim, drafter, "spec", "SpeculativeConfig", kwargs)
    sim.say("arch", (drafter.arch,))
    sim.drafter_max_len = min(drafter.max_len, sim.max_model_len)
    sim.say("max_len", (sim.drafter_max_len,))
    if method in ("eagle3", "extract_hidden_states"):
        verdict = judge_allowlist(allowlists(sim.pkg))
        entries = verdict.get("entries")
        mtype = sim.target.text_model_type
        if verdict["present"] and not admits(entries, mtype):
            name = verdict.get("name") or "aux_hidden_states_supported"
            msg = sim.src.message(
                (str(verdict.get("file") or "config/speculative.py"),),
                " is only supported for ",
                {"method": method, name: entries, "model_type": mtype},
                "Eagle3 is only supported for %r models. Got "
                "self.target_model_config.hf_text_config.model_type=%r" % (entries, mtype),
            )
            config_error(sim, "spec", "SpeculativeConfig", msg, kwargs)


def engine_config(sim: SimState) -> str:
    spec = ""
    if sim.spec is not None and sim.drafter is not None:
        spec = "speculative_config=SpeculativeConfig(method=%r, model=%r, num_spec_tokens=%d), " % (
            sim.method,
            sim.drafter.path,
            sim.k,
        )
    quant = (
        sim.target.config.get("quantization_config")
        or sim.target.text.get("quantization_config")
        or {}
    )
    qname = quant.get("quant_method") if isinstance(quant, dict) else None
    return (
        "model=%r, %stokenizer=%r, skip_tokenizer_init=False, tokenizer_mode=auto, "
        "revision=None, tokenizer_revision=None, trust_remote_code=%s, dtype=torch.bfloat16, "
        "max_seq_len=%d, download_dir=None, load_format=auto, tensor_parallel_size=%d, "
        "pipeline_parallel_size=%d, data_parallel_size=1, disable_custom_all_reduce=False, "
        "quantization=%s, enforce_eager=%s, kv_cache_dtype=auto, device_config=cuda, "
        "seed=0, served_model_name=%s, enable_prefix_caching=True, "
        "enable_chunked_prefill=True, pooler_config=None, compilation_config={'level': 3}"
        % (
            sim.model_path,
            spec,
            sim.model_path,
            sim.trust,
            sim.max_model_len,
            sim.tp,
            sim.pp,
            qname,
            bool(sim.args.get("enforce_eager")),
            sim.served[0],
        )
    )


def target_bytes(sim: SimState) -> float:
    size = sim.target.total_size or 595 * 10**9
    return size / max(1, sim.tp * sim.pp)


def drafter_bytes(sim: SimState) -> float:
    if sim.drafter is None:
        return 0.0
    return float(sim.drafter.total_size or 2 * GIB)


def is_mla(sim: SimState) -> bool:
    return bool(sim.target.get("kv_lora_rank"))
