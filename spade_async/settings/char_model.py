"""A random-initialised tiny Llama over a character vocabulary, for the learning demo.

With SmolLM2's 49,152-token vocabulary a random tiny model spreads each reply's first token
over thousands of tokens per letter, and nothing ties the tokens of one letter together: a
policy gradient on "which letter" moves a few dozen sampled tokens out of tens of thousands.
One token per character (printable ASCII, newline, tab, the ChatML specials; ~100 ids)
makes a letter one token, so the designer's choice is a 100-way distribution that a handful
of trainer steps can move. The chat template is SmolLM2's (ChatML).
"""

from __future__ import annotations

from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
CHARS = ["\n", "\t"] + [chr(c) for c in range(32, 127)]


def char_tokenizer(chat_template: str):
    """A fast tokenizer with one id per character; unknown characters map to <unk>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # type: ignore[attr-defined]
    tok.decoder = decoders.Fuse()  # type: ignore[attr-defined]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = chat_template
    return fast


def char_model_dir(
    path: str | Path,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
    embedding_std: float | None = None,
) -> Path:
    """Write the character-level random Llama to ``path`` (kept if already there).

    ``embedding_std``: the (tied) embedding's init std instead of the config's 0.02. A LoRA
    on the blocks leaves embedding, head and final norm frozen, so the logits are at most
    |h| |e| apart with |h| = sqrt(hidden) fixed by the final RMSNorm: at 0.02 no block output
    puts more than ~0.32 of the mass on the 26 letters (uniform: 0.26), at 0.1 ~0.96 (what a
    pretrained model's embedding gives a LoRA; tests/integration/test_designer_learning.py)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from spade_async.models import _atomic_dir, tokenizer_dir

    path = Path(path)
    if (path / "config.json").is_file():
        return path
    template = AutoTokenizer.from_pretrained(tokenizer_dir("smollm2-135m-instruct")).chat_template
    tok = char_tokenizer(template)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    if embedding_std is not None:
        with torch.no_grad():
            model.get_input_embeddings().weight.normal_(0.0, embedding_std)

    def build(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    return _atomic_dir(path, build)
