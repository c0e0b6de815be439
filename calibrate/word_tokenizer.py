"""A word-level tokenizer for the shipped tiny models (which ship none), so that a real
vLLM API server can tokenize and detokenize and `vllm bench serve` can make random
prompts offline: token id i <-> the word "t<i>" (0-2: <unk>, <s>, </s>), split on
whitespace. Used by tests/test_server_run.py and benchmarks/server_time.py. Its speed
is not a Llama BPE tokenizer's (see benchmarks/server_time.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path


def with_word_tokenizer(model_dir: str | Path, out_dir: str | Path) -> Path:
    """A copy of `model_dir`'s config.json in `out_dir` with a word-level tokenizer of its vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    src, dst = Path(model_dir), Path(out_dir)
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    n = int(json.loads((src / "config.json").read_text())["vocab_size"])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, n)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(dst / "tokenizer.json"))
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (dst / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **special}))
    (dst / "special_tokens_map.json").write_text(json.dumps(special))
    return dst
