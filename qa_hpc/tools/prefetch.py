#!/usr/bin/env python
"""Put the BASELINE model and data set into the Hugging Face cache, or say whether they are there.

Compute nodes of most clusters have no internet, so the login node fills HF_HOME once
(setup_bert.sh) and jobs read it offline (job_ft3.sh checks first and falls back to the
offline demo when the cache lacks them).

    python -m qa_hpc.tools.prefetch                 # download what is missing (login node); exit 0 when
                                                    # both are cached then, hub or not
    python -m qa_hpc.tools.prefetch --check         # offline: exit 0 when both are cached
                                                    # (--dataset "": the model only)
    python -m qa_hpc.tools.prefetch --reachable     # exit 0 when the hub answers (5 s timeout)

Greppable lines: CACHED model=... / CACHED dataset=... / MISSING ... / HUB_REACHABLE=0|1.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.request

MODEL_FILES = ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "model.safetensors")


def hub_reachable(model: str, timeout: float = 5.0) -> bool:
    """True when the hub answers for `model`: one HTTP request, no download. Not huggingface_hub's
    model_info: it may first fetch other things (its agent-harness registry), writes caches, and reads
    offline mode as "no"."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    try:
        with urllib.request.urlopen(f"{endpoint}/api/models/{model}", timeout=timeout) as resp:
            return resp.status == 200
    except Exception:  # noqa: BLE001 - any failure means "not reachable" here
        return False


def report(model: str, dataset: str) -> bool:
    """Print what the cache holds; True when both are there: the model's config and weights, and the data set
    loading offline."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    if os.path.isdir(model):  # a local folder (a model copied to project space): used as it is
        weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
        complete = os.path.isfile(os.path.join(model, "config.json")) and any(
            os.path.isfile(os.path.join(model, name)) for name in weights
        )
        path = os.path.abspath(model) if complete else None
    else:
        try:
            config = try_to_load_from_cache(model, "config.json")
            weights = try_to_load_from_cache(model, "model.safetensors")
        except HFValidationError:  # no hub name either (a folder that is not there): not cached
            config = weights = None
        path = os.path.dirname(config) if isinstance(config, str) and isinstance(weights, str) else None
    print(f"CACHED model={model} path={path}" if path else f"MISSING model={model}", flush=True)
    if not dataset:  # the run reads its own files
        print("DATASET=none (the run's own files)", flush=True)
        return bool(path)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    import datasets

    datasets.utils.logging.set_verbosity_error()
    try:
        splits = {split: len(ds) for split, ds in datasets.load_dataset(dataset).items()}
    except Exception:  # noqa: BLE001 - any failure means "not cached"
        splits = {}
    print(
        f"CACHED dataset={dataset} " + " ".join(f"{k}={v}" for k, v in splits.items())
        if splits
        else f"MISSING dataset={dataset}",
        flush=True,
    )
    return bool(path and splits)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bert-base-uncased")
    ap.add_argument("--dataset", default="squad", help='"": none (a run of its own files): the model only')
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="only report what is cached (offline)")
    mode.add_argument("--reachable", action="store_true", help="only test whether the hub answers")
    args = ap.parse_args(argv)
    print(f"HF_HOME={os.environ.get('HF_HOME', '(default ~/.cache/huggingface)')}", flush=True)
    if args.check:
        return 0 if report(args.model, args.dataset) else 1
    reachable = hub_reachable(args.model)
    print(f"HUB_REACHABLE={int(reachable)}", flush=True)
    if args.reachable:
        return 0 if reachable else 1
    # fetch the model files and the data set into HF_HOME; without the hub, what an earlier run fetched
    # may be all there is to have
    if reachable:
        import datasets
        from huggingface_hub import snapshot_download

        fetches = (
            lambda: snapshot_download(args.model, allow_patterns=list(MODEL_FILES)),
            lambda: datasets.load_dataset(args.dataset),
        )
        for fetch in fetches:  # each on its own: a model that fails to come still lets the data come
            # the hub answered and a fetch failed anyway (a proxy, a quota): one line, then the report below
            # says what is missing
            try:
                fetch()
            except Exception as err:  # noqa: BLE001 - any failure is reported, none is fatal here
                print(f"FETCH_FAILED {type(err).__name__}: {err}", flush=True)
    return 0 if report(args.model, args.dataset) else 1


if __name__ == "__main__":
    sys.exit(main())
