"""An HF id (ORG/NAME) as a folder of the Hugging Face cache: taken from the cache when it is complete there,
else downloaded from the Hub with huggingface_hub's snapshot_download (its own progress bars, on stderr).

What is fetched depends on who needs it. The preprocessor needs the files that describe the model, its
tokenizer, processor, chat template and generation config (CONFIG_FILES: small, no weights); the engine needs
those and the weights: the safetensors shards a `*.safetensors.index.json` lists, else every top-level
`*.safetensors`. Only the repo's top level is fetched (subfolders such as original/ or onnx/ hold other formats).

huggingface_hub reads HF_ENDPOINT, HF_HOME / HF_HUB_CACHE, HF_TOKEN and HF_HUB_OFFLINE itself; nothing here sets
them. It writes each file under a temporary `*.incomplete` name and renames it once its size checks, so a file
in a snapshot is whole; a snapshot that lacks files (an interrupted download, or the preprocessor's files only)
is not taken as a model: the repo's file listing, cached with the first download, says what it must hold.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable
from pathlib import Path

from huggingface_hub import constants, get_cached_repo_tree, snapshot_download
from huggingface_hub.errors import (
    CachedRepoTreeNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    IncompleteSnapshotError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from splice.errors import FailedPrecondition, SpliceError, Unavailable

# *.json: config, tokenizer(_config), special tokens, added tokens, processor / preprocessor config,
# chat_template.json, generation_config, a weights index; *.jinja: chat templates; *.txt: merges / vocab;
# *.model: sentencepiece tokenizers; *.tiktoken: tiktoken vocabularies.
CONFIG_FILES = ("*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken")
TOP_LEVEL_ONLY = ("*/*",)
SAFETENSORS = "*.safetensors"
TOKEN_HINT = "check the name, or set HF_TOKEN for a gated/private model"


class NotOnHub(FailedPrecondition):
    """The Hub has no repo by that name (or none this token may see)."""


def fetch(repo_id: str, *, weights: bool, progress: Callable[[str], None] | None = None) -> str:
    """The snapshot folder of `repo_id` holding its config and tokenizer files, and its weights if `weights`."""
    say = progress or (lambda _: None)
    folder = _snapshot(repo_id, CONFIG_FILES, None, "config and tokenizer files", say)
    if not (Path(folder) / "config.json").is_file():
        raise FailedPrecondition(f"model {repo_id!r} on the Hub has no config.json: not a transformers model")
    if not weights:
        return folder
    shards = _indexed_shards(Path(folder))
    # the commit the first part came from: both parts of one snapshot even if the repo changes meanwhile
    folder = _snapshot(repo_id, shards or (SAFETENSORS,), Path(folder).name, "weights", say)
    missing = [s for s in shards if not (Path(folder) / s).is_file()]
    if missing or not any(Path(folder).glob(SAFETENSORS)):
        raise FailedPrecondition(
            f"model {repo_id!r} has no safetensors weights on the Hub"
            + (f" ({', '.join(missing[:3])} listed by its index are missing)" if missing else "")
            + ": Splice loads *.safetensors only")
    return folder


def _indexed_shards(folder: Path) -> tuple[str, ...]:
    """The shard files a top-level safetensors index names; () without an index."""
    shards: set[str] = set()
    for index in folder.glob("*.safetensors.index.json"):
        try:
            shards.update(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError, AttributeError) as exc:
            raise FailedPrecondition(f"{index.name} of {folder}: not a safetensors index ({exc})") from exc
    return tuple(sorted(shards))


def _snapshot(repo_id: str, patterns: tuple[str, ...], revision: str | None, what: str,
              say: Callable[[str], None]) -> str:
    """The snapshot folder holding every repo file matching `patterns`: the cached one when the repo's cached
    listing shows it complete, else downloaded (offline: the cached one as it is, or a clear error)."""
    folder, state = _cached(repo_id, patterns, revision)
    if state == COMPLETE:
        return folder
    if constants.is_offline_mode():
        if state == UNCHECKED:  # no listing to check it against: huggingface_hub itself would use it
            return folder
        where = "are only partly in" if state == INCOMPLETE else "are not in"
        raise FailedPrecondition(
            f"model {repo_id!r}: its {what} {where} the Hugging Face cache ({constants.HF_HUB_CACHE}), and "
            f"HF_HUB_OFFLINE=1 forbids downloading them: unset HF_HUB_OFFLINE where {constants.ENDPOINT} can be "
            f"reached, or fetch the model there with `hf download {repo_id}` and copy the cache here")
    say(f"{repo_id}: downloading its {what} from {constants.ENDPOINT} into {constants.HF_HUB_CACHE}")
    try:
        return snapshot_download(repo_id, revision=revision, allow_patterns=list(patterns),
                                 ignore_patterns=list(TOP_LEVEL_ONLY))
    except Exception as exc:
        raise _failure(repo_id, exc, constants.ENDPOINT, constants.HF_HUB_CACHE) from exc


ABSENT, INCOMPLETE, UNCHECKED, COMPLETE = "absent", "incomplete", "unchecked", "complete"


def _cached(repo_id: str, patterns: tuple[str, ...], revision: str | None) -> tuple[str, str]:
    """(the cached snapshot folder or "", its state). A folder is COMPLETE only against the repo's file listing
    that snapshot_download caches; files fetched one by one (e.g. by transformers) leave none: UNCHECKED."""
    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=list(patterns),
                                   ignore_patterns=list(TOP_LEVEL_ONLY), local_files_only=True)
    except IncompleteSnapshotError:  # the listing names files the snapshot lacks
        return "", INCOMPLETE
    except LocalEntryNotFoundError:
        return "", ABSENT
    try:
        get_cached_repo_tree(repo_id, revision=Path(folder).name)
    except CachedRepoTreeNotFoundError:
        return folder, UNCHECKED
    return folder, COMPLETE


def _failure(repo_id: str, exc: Exception, endpoint: str, cache: str) -> SpliceError:
    """One line for what went wrong fetching `repo_id`."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, GatedRepoError):
        return FailedPrecondition(f"model {repo_id!r} is gated on the Hub (HTTP {status}): accept its terms on "
                                  f"{endpoint}/{repo_id}, then set HF_TOKEN to a token of that account")
    if isinstance(exc, RepositoryNotFoundError):
        return NotOnHub(f"model {repo_id!r} not found on the Hub (HTTP {status}): {TOKEN_HINT}")
    if isinstance(exc, RevisionNotFoundError):
        return FailedPrecondition(f"model {repo_id!r}: revision not found on the Hub (HTTP {status})")
    if isinstance(exc, HfHubHTTPError) and status is not None:
        return Unavailable(f"downloading model {repo_id!r}: the Hub at {endpoint} answered HTTP {status} "
                           f"({_first_line(exc)}); run again later")
    if isinstance(exc, LocalEntryNotFoundError):  # the Hub could not be reached and nothing was cached
        cause = exc.__cause__ or exc.__context__
        why = f"{type(cause).__name__}: {_first_line(cause)}" if cause else _first_line(exc)
        return Unavailable(f"cannot reach the Hub at {endpoint} to download model {repo_id!r} ({why}), and it is "
                           f"not in the Hugging Face cache ({cache}): check the network or HF_ENDPOINT, or fetch "
                           f"it elsewhere with `hf download {repo_id}` and copy the cache here")
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return FailedPrecondition(f"downloading model {repo_id!r}: no space left on the device holding {cache}; "
                                  f"free some, or point HF_HOME (or HF_HUB_CACHE) at a larger disk")
    # a connection lost mid-file that huggingface_hub's own resumes did not get past, a size that did not check
    return Unavailable(f"downloading model {repo_id!r} from {endpoint} failed ({type(exc).__name__}: "
                       f"{_first_line(exc)}); the files completed so far stay in the cache, nothing partial is "
                       f"kept: run again to fetch the rest")


def _first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
