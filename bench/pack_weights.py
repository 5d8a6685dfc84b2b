"""A model directory made small enough to travel with the repository to a GPU node without internet, and back.

    python bench/pack_weights.py pack MODEL_DIR PACKED_DIR      # MiniLM: model.safetensors 91 MB -> ~54 MB
    python bench/pack_weights.py unpack PACKED_DIR MODEL_DIR    # model.safetensors again, and the small files

The weights are the one large file: every fp32 value is rounded to 16 significant bits (its lowest byte
dropped: a relative change of at most 2^-16, 256 times finer than the bf16 the GPU recipe computes in), and
each of the three bytes kept is deflated as one stream over all tensors (the sign-and-exponent bytes shrink
to ~40%, the mantissa bytes hardly). Tensors of other dtypes travel whole; the directory's other files
(config, tokenizer) as they are.
"""

from __future__ import annotations

import json
import shutil
import sys
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

WEIGHTS = "model.safetensors"
MANIFEST = "packed_weights.json"
KEPT_BYTES = (1, 2, 3)  # of each little-endian fp32 value; byte 0 is rounded away
MAX_RELATIVE_CHANGE = 2.0**-16
SMALL_FILE_BYTES = 4 << 20  # the directory's other files travel as they are


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str  # numpy's name
    shape: tuple[int, ...]


def round_away_low_byte(values: np.ndarray) -> np.ndarray:
    """fp32 values rounded to nearest at 16 significant bits, as uint32 words whose lowest byte is zero."""
    if not np.isfinite(values).all():
        raise ValueError("only finite weights can be packed")
    words = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((words + 0x80) & 0xFFFFFF00).astype(np.uint32)


def pack(model_dir: Path, packed_dir: Path) -> int:
    """Write packed_dir from model_dir; return its size in bytes."""
    tensors = load_file(str(model_dir / WEIGHTS))
    packed_dir.mkdir(parents=True, exist_ok=True)
    floats = [name for name, value in tensors.items() if value.dtype == np.float32]
    others = [name for name, value in tensors.items() if value.dtype != np.float32]
    words = np.concatenate([round_away_low_byte(tensors[name]).ravel() for name in floats])
    planes = words.view(np.uint8).reshape(-1, 4)
    for byte in KEPT_BYTES:
        (packed_dir / f"fp32_byte{byte}.zz").write_bytes(zlib.compress(planes[:, byte].tobytes(), 6))
    rest = b"".join(np.ascontiguousarray(tensors[name]).tobytes() for name in others)
    (packed_dir / "other_dtypes.zz").write_bytes(zlib.compress(rest, 6))
    entries = [TensorEntry(name, str(tensors[name].dtype), tensors[name].shape) for name in floats + others]
    (packed_dir / MANIFEST).write_text(json.dumps([asdict(e) for e in entries], indent=1), encoding="utf-8")
    for path in sorted(model_dir.iterdir()):
        if path.is_file() and path.name != WEIGHTS and path.stat().st_size <= SMALL_FILE_BYTES:
            shutil.copy(path, packed_dir / path.name)
    return sum(path.stat().st_size for path in packed_dir.iterdir())


def read_entries(packed_dir: Path) -> list[TensorEntry]:
    listed = json.loads((packed_dir / MANIFEST).read_text(encoding="utf-8"))
    return [TensorEntry(entry["name"], entry["dtype"], tuple(entry["shape"])) for entry in listed]


def read_fp32(packed_dir: Path) -> np.ndarray:
    """Every fp32 value, all tensors one after another, from the kept bytes."""
    words = None
    for byte in KEPT_BYTES:
        plane = np.frombuffer(zlib.decompress((packed_dir / f"fp32_byte{byte}.zz").read_bytes()), np.uint8)
        shifted = plane.astype(np.uint32) << np.uint32(8 * byte)
        words = shifted if words is None else words | shifted
    return words.view(np.float32)


def unpack(packed_dir: Path, model_dir: Path) -> None:
    """Write model_dir (model.safetensors and the small files) from packed_dir."""
    floats = read_fp32(packed_dir)
    rest = zlib.decompress((packed_dir / "other_dtypes.zz").read_bytes())
    tensors = {}
    float_at = 0
    rest_at = 0
    for entry in read_entries(packed_dir):
        count = int(np.prod(entry.shape))
        if entry.dtype == "float32":
            tensors[entry.name] = floats[float_at : float_at + count].reshape(entry.shape)
            float_at += count
        else:
            size = count * np.dtype(entry.dtype).itemsize
            tensors[entry.name] = np.frombuffer(rest[rest_at : rest_at + size], entry.dtype).reshape(
                entry.shape
            )
            rest_at += size
    model_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(model_dir / WEIGHTS), metadata={"format": "pt"})
    for path in sorted(packed_dir.iterdir()):
        if path.name != MANIFEST and path.suffix != ".zz":
            shutil.copy(path, model_dir / path.name)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("pack", "unpack"):
        print(__doc__, file=sys.stderr)
        return 2
    command, source, target = argv[0], Path(argv[1]), Path(argv[2])
    if command == "pack":
        size = pack(source, target)
        print(f"PACKED_WEIGHTS dir={target} bytes={size} from={source}")
    else:
        unpack(source, target)
        print(f"UNPACKED_WEIGHTS dir={target} from={source}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
