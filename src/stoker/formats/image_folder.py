"""ImageFolder: a folder per class, indexed once in sorted order, one class mapping for all splits.

The index (every image's path relative to ``root`` and its label) is built once by walking
``root`` in sorted order, so it is the same on every machine and filesystem, and is kept in
two flat arrays (a :class:`~stoker.compact.StringArray` of paths and an int64 array of
labels) that forked workers share without copying. It can be saved as JSON and loaded back
instead of walking millions of files again::

    root/cat/001.jpg        classes = ["cat", "dog"]
    root/cat/002.png        class_to_idx = {"cat": 0, "dog": 1}
    root/dog/a/003.jpg      (subfolders of a class folder belong to that class)

Files are opened only when a sample is read, so nothing open is inherited by workers.
Images are decoded to ``(H, W, 3)`` uint8 RGB arrays (see :mod:`stoker.vision`) and then
passed to ``transform``.

Example:
    >>> from stoker.vision import eval_transform, train_transform
    >>> train = ImageFolder("data/train", transform=train_transform(224))  # doctest: +SKIP
    >>> val = ImageFolder(
    ...     "data/val", classes=train.classes, transform=eval_transform(224)
    ... )  # doctest: +SKIP
    >>> train.save_index("data/train_index.json")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from stoker._errors import DatasetError
from stoker._index import normalize_index
from stoker._thread_safety import is_thread_safe
from stoker._validate import is_int
from stoker.compact import StringArray
from stoker.datasets import Dataset
from stoker.formats._walk import Claim, Identity, WalkedFile, claim_directory, walk_files
from stoker.storage.remote import is_remote
from stoker.vision.decode import PILLOW_LIMIT, MaxPixels
from stoker.vision.records import check_decode_options, decode_and_transform

__all__ = ["IMG_EXTENSIONS", "INDEX_FORMAT", "ImageFolder"]

logger = logging.getLogger("stoker")

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
INDEX_FORMAT = "stoker.ImageFolder"
_INDEX_VERSION = 1
_ROOT_HINT = "pass the folder that holds one subfolder per class"


class ImageFolder(Dataset[tuple[Any, Any]]):
    """Images in ``root/<class>/...``, as ``(image, label)`` pairs (torchvision's ImageFolder).

    Args:
        root: the local folder holding one subfolder per class (a URL such as ``s3://...``
            raises ``ValueError``: pack the images into a ``PackedDataset`` to read them
            from object storage).
        classes: the class mapping. ``None``: the sorted subfolder names of ``root``. A list
            of names (label = position), a ``{name: label}`` dict, another ImageFolder, or
            the path of a saved index JSON: use the same mapping as another split
            (``classes=train.classes``); a subfolder of ``root`` that is not in it raises, a
            class without a subfolder is fine.
        transform: any callable applied to the decoded image: a stoker.vision transform, a
            function, or a torchvision transform. torchvision's transforms expect a
            ``PIL.Image``: one whose class comes from torchvision gets it automatically
            (``decode="auto"``); for other PIL-based callables pass ``decode="pil"``.
        target_transform: any callable applied to the label (an int).
        extensions: file endings counted as images (case does not matter).
        index: a saved index to use instead of walking ``root``: the path of its JSON
            (written by :meth:`save_index`, or a plain ``{"classes", "items"}`` JSON index)
            or the loaded dict. Item paths are relative to ``root`` (absolute ones are kept).
        decode: ``"auto"``: numpy arrays, JPEGs decoded by simplejpeg (libjpeg-turbo) when
            installed, by Pillow otherwise; but a ``PIL.Image`` when ``transform`` comes
            from torchvision. ``"simplejpeg"`` or ``"pillow"``: that decoder, numpy arrays.
            ``"pil"``: always a ``PIL.Image`` (for torchvision or other PIL transforms).
        rgb: convert every image to 3-channel RGB (grayscale, palette, RGBA and CMYK files
            included; alpha is dropped). ``False`` keeps 1, 3 or 4 channels.
        size_hint: the smallest image the transform needs: an int (shorter side) or
            ``(height, width)``. JPEGs are decoded at 1/2, 1/4 or 1/8 scale when that still
            covers it, which is much faster for large photos. ``None`` (default) takes the
            hint from the transform (``Resize(256)`` first: 256; crops first: none);
            ``"full"`` always decodes at full size. The transform then receives the
            reduced image.
        max_pixels: an image whose header declares more pixels than this is refused
            (an :class:`~stoker.vision.ImageDecodeError` naming the file and its size)
            before it is decoded: ``"pillow"`` (default: Pillow's
            ``PIL.Image.MAX_IMAGE_PIXELS``), an int, or ``None`` for no limit.

    Attributes:
        classes: class names, ordered by label.
        class_to_idx: ``{name: label}``.
        targets: the labels, an int64 array (read-only).

    Raises:
        FileNotFoundError: ``root`` is missing, has no class folders, or no images.
        NotADirectoryError: ``root`` is a file.
        DatasetError: a class folder is not in the given ``classes``.

    Example:
        >>> import tempfile, pathlib
        >>> from PIL import Image
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> for name in ("cat/1.png", "cat/2.jpg", "dog/1.png"):
        ...     (root / name).parent.mkdir(exist_ok=True)
        ...     Image.new("L", (8, 6)).save(root / name)
        >>> folder = ImageFolder(root)
        >>> len(folder), folder.classes, folder[2][0].shape, folder[2][1]
        (3, ['cat', 'dog'], (6, 8, 3), 1)
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        classes: Sequence[str] | Mapping[str, int] | str | os.PathLike[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        extensions: Sequence[str] | str = IMG_EXTENSIONS,
        index: str | os.PathLike[str] | Mapping[str, Any] | None = None,
        decode: str = "auto",
        rgb: bool = True,
        size_hint: int | tuple[int, int] | str | None = None,
        max_pixels: MaxPixels = PILLOW_LIMIT,
    ) -> None:
        self.max_pixels = check_decode_options(decode, size_hint, max_pixels, transform)
        if target_transform is not None and not callable(target_transform):
            msg = f"target_transform must be a callable or None, got {target_transform!r}"
            raise TypeError(msg)
        self.root = os.fspath(root)
        if is_remote(self.root):
            msg = (
                f"ImageFolder reads a local folder only, and root {self.root!r} is a URL: copy "
                "the images to a local disk, or pack them (stoker pack) into a PackedDataset "
                "and read that from the URL (see docs/object-storage.md)"
            )
            raise ValueError(msg)
        self.extensions = _normalise_extensions(extensions)
        self.transform = transform
        self.target_transform = target_transform
        self.decode = decode
        self.rgb = bool(rgb)
        self.size_hint = size_hint
        mapping = _read_mapping(classes)
        if index is not None:
            paths, labels, found = _read_index(index)
        else:
            paths, labels, found = _scan(self.root, self.extensions)
        if mapping is None:
            mapping = found
        else:
            labels = _relabel(
                labels, found, mapping, repr(self.root) if index is None else _describe_index(index)
            )
        self.class_to_idx: dict[str, int] = mapping
        self.classes: list[str] = sorted(mapping, key=mapping.__getitem__)
        self._paths = StringArray(paths)
        self._targets = np.asarray(labels, dtype=np.int64)
        self._targets.flags.writeable = False

    @classmethod
    def from_index(
        cls, path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None, **kwargs: Any
    ) -> ImageFolder:
        """Loads a saved index instead of walking the folder again.

        Args:
            path: the JSON written by :meth:`save_index` (or a plain ``{"classes", "items"}`` JSON
            index).
            root: where the images are now; default: the ``root`` recorded in the file, or
                the current directory for an index without one (paths used as written).
            **kwargs: the other arguments of :class:`ImageFolder`.

        Example:
            >>> folder = ImageFolder.from_index(
            ...     "train_index.json", root="/data/train"
            ... )  # doctest: +SKIP
        """
        loaded = _load_index(path)
        if root is None:
            recorded = loaded.get("root") if isinstance(loaded, Mapping) else None
            root = recorded if isinstance(recorded, str) else ""
        return cls(root, index=loaded, **kwargs)

    # -- the index ------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._targets)

    @property
    def targets(self) -> np.ndarray:
        """Every sample's label, an int64 array (read-only)."""
        return self._targets

    @property
    def samples(self) -> list[tuple[str, int]]:
        """``[(path, label), ...]`` as in torchvision; a new list each time: prefer :meth:`path`."""
        labels = self._targets.tolist()
        return [(os.path.join(self.root, p), t) for p, t in zip(self._paths, labels, strict=True)]

    imgs = samples

    def path(self, index: int) -> str:
        """The file of sample ``index``."""
        return os.path.join(self.root, self._paths[self._check_index(index)])

    def describe_sample(self, index: int) -> str:
        """The file of sample ``index`` (named in ``on_error="skip"`` reports)."""
        return self.path(index)

    def save_index(self, path: str | os.PathLike[str]) -> None:
        """Writes the index as JSON: ``{"classes": [...], "items": [{"path", "label"}], ...}``.

        Paths are relative to ``root`` (with ``/`` separators), so the data can move; load
        it with :meth:`from_index` or ``ImageFolder(root, index=path)``. The file is written
        to a temporary name and renamed, so a crash never leaves half an index.
        """
        path = os.fspath(path)
        temporary = f"{path}.tmp{os.getpid()}"
        mapping = self.class_to_idx.items()
        with open(temporary, "w", encoding="utf-8") as file:
            file.write(f'{{"format": "{INDEX_FORMAT}", "version": {_INDEX_VERSION}, ')
            file.write(f'"root": {_json_string(os.path.abspath(self.root))},\n')
            file.write(f'"classes": [{", ".join(_json_string(c) for c in self.classes)}],\n')
            file.write(
                f'"class_to_idx": {{{", ".join(f"{_json_string(c)}: {i}" for c, i in mapping)}}},\n'
            )
            file.write('"items": [')
            labels = self._targets.tolist()
            for position, (item, label) in enumerate(zip(self._paths, labels, strict=True)):
                file.write(",\n" if position else "\n")
                file.write(f'{{"path": {_json_string(item)}, "label": {label}}}')
            file.write("\n]}\n")
        os.replace(temporary, path)

    # -- reading --------------------------------------------------------------------

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        i = self._check_index(index)
        path = os.path.join(self.root, self._paths[i])
        with open(path, "rb") as file:  # opened per read: nothing to inherit across fork
            data = file.read()
        image = decode_and_transform(
            data,
            self.transform,
            decode=self.decode,
            rgb=self.rgb,
            size_hint=self.size_hint,
            max_pixels=self.max_pixels,
            source=path,
        )
        label: Any = int(self._targets[i])
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    def _check_index(self, index: Any) -> int:
        return normalize_index(index, len(self._targets), "ImageFolder")

    @property
    def thread_safe(self) -> bool:
        """Each read opens its file: thread-safe when the transforms are (see worker_mode)."""
        return (
            type(self).__getitem__ is ImageFolder.__getitem__
            and (self.transform is None or is_thread_safe(self.transform))
            and (self.target_transform is None or is_thread_safe(self.target_transform))
        )

    def __repr__(self) -> str:
        return (
            f"ImageFolder(root={self.root!r}, {len(self)} images, {len(self.classes)} classes, "
            f"transform={self.transform!r})"
        )


# -- building the index -------------------------------------------------------------------


def _nfc(name: str) -> str:
    """Unicode NFC: macOS may list 'été' decomposed; order and class names must not depend on it."""
    return unicodedata.normalize("NFC", name)


def _normalise_extensions(extensions: Sequence[str] | str) -> tuple[str, ...]:
    if isinstance(extensions, str):
        extensions = (extensions,)
    if not extensions or not all(isinstance(e, str) and e.strip(".") for e in extensions):
        msg = f"extensions must be file endings such as ('.jpg', '.png'), got {extensions!r}"
        raise ValueError(msg)
    return tuple(e.lower() if e.startswith(".") else f".{e.lower()}" for e in extensions)


def _scan(root: str, extensions: tuple[str, ...]) -> tuple[list[str], list[int], dict[str, int]]:
    """Walks ``root``: (relative paths, labels, ``{class: label}`` of the sorted class folders).

    Order: classes by name, then directories by relative path, then files by name (the
    order of torchvision's ``sorted(os.walk(...))``), all compared as NFC strings so every
    filesystem gives the same index. Hidden entries (``.name``) are skipped.
    """
    if not os.path.exists(root):
        msg = f"ImageFolder root {root!r} does not exist; {_ROOT_HINT}"
        raise FileNotFoundError(msg)
    if not os.path.isdir(root):
        msg = f"ImageFolder root {root!r} is not a directory; {_ROOT_HINT}"
        raise NotADirectoryError(msg)
    class_dirs: list[tuple[str, str]] = []
    loose = 0
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                class_dirs.append((_nfc(entry.name), entry.name))
            elif entry.name.lower().endswith(extensions):
                loose += 1
    class_dirs.sort()
    looked_for = ", ".join(extensions)
    if not class_dirs:
        hint = (
            f" It holds {loose} image file(s) directly: move them into one subfolder per class "
            "(root/cat/1.jpg)."
            if loose
            else ""
        )
        msg = (
            f"ImageFolder found no class folders in {root!r} "
            f"(looked for images ending in {looked_for}).{hint}"
        )
        raise FileNotFoundError(msg)
    paths: list[str] = []
    labels: list[int] = []
    claims: dict[Identity, Claim] = {}
    claim_directory(root, claims, "the dataset root")
    for _, dirname in class_dirs:
        claim_directory(os.path.join(root, dirname), claims, f"class {dirname!r}")
    for label, (_, dirname) in enumerate(class_dirs):
        found = _walk_class(
            os.path.join(root, dirname), dirname, extensions, claims, f"class {dirname!r}"
        )
        if not found:
            logger.warning(
                "ImageFolder: class folder %r holds no files ending in %s; "
                "the class keeps label %d with no images",
                os.path.join(root, dirname),
                looked_for,
                label,
            )
        paths.extend(found)
        labels.extend([label] * len(found))
    if not paths:
        names = ", ".join(repr(d) for _, d in class_dirs[:5]) + (
            ", ..." if len(class_dirs) > 5 else ""
        )
        msg = (
            f"ImageFolder found no images in {root!r}: none of its {len(class_dirs)} class "
            f"folder(s) ({names}) holds a file ending in {looked_for}. Check the path, or pass "
            "extensions=(...) for other file types."
        )
        raise FileNotFoundError(msg)
    _warn_if_one_level_up(root, [dirname for _, dirname in class_dirs], paths)
    return paths, labels, {name: label for label, (name, _) in enumerate(class_dirs)}


def _warn_if_one_level_up(root: str, class_dirs: list[str], paths: list[str]) -> None:
    """Warns when no class folder holds an image of its own, only folders that do: ``root``
    is probably one level too high.

    ``ImageFolder("photos")`` over ``photos/train/cat/...`` and ``photos/val/cat/...``
    finds the classes ``train`` and ``val`` and gives every training image one label;
    ``ImageFolder("photos/train")`` was meant. ``paths`` are the images found, relative to
    ``root``.
    """
    if not paths or any(path.count("/") < 2 for path in paths):
        return  # some class folder holds images of its own: a normal layout
    first = paths[0].split("/", 1)[0]
    inner = os.path.join(root, first)
    folders = sorted({path.split("/", 2)[1] for path in paths if path.split("/", 1)[0] == first})
    shown = ", ".join(repr(f) for f in folders[:4]) + (", ..." if len(folders) > 4 else "")
    if len(class_dirs) == 1:
        found = f"{root!r} holds a single class folder, {first!r}, and it holds folders ({shown})"
        effect = f"every image would get the one label of class {first!r}"
    else:
        names = ", ".join(repr(d) for d in class_dirs[:4]) + (
            ", ..." if len(class_dirs) > 4 else ""
        )
        found = (
            f"{root!r} holds {len(class_dirs)} class folders ({names}) with no images of their "
            f"own, only folders ({first!r} holds {shown})"
        )
        effect = f"every image in {inner!r} would get the one label of class {first!r}"
    logger.warning(
        "ImageFolder: %s: %s. If those folders are the classes, pass the folder that holds "
        "them: did you mean ImageFolder(%r) (stoker pack %s DST)?",
        found,
        effect,
        inner,
        inner,
    )


def _walk_class(
    top: str, prefix: str, extensions: tuple[str, ...], claims: dict[Identity, Claim], owner: str
) -> list[str]:
    """Image paths under one class folder, relative to root, in sorted-walk order.

    Each directory is walked once (a symlink loop lists nothing twice); a link to the root or
    into another class folder raises (see ``_walk.walk_files``) instead of giving that folder's
    images this class's label.
    """

    def keep(name: str) -> bool:
        return name.lower().endswith(extensions)

    found = walk_files(top, relative=prefix, keep=keep, claims=claims, owner=owner)
    return [f"{f.folder}/{f.name}" for f in sorted(found, key=_walk_order)]


def _walk_order(found: WalkedFile) -> tuple[str, str]:
    return _nfc(found.folder), _nfc(found.name)


def _relabel(
    labels: list[int], found: dict[str, int], mapping: dict[str, int], where: str
) -> list[int]:
    """Maps labels given by the ``found`` classes onto ``mapping``'s; unknown classes raise."""
    unknown = [name for name in found if name not in mapping]
    if unknown:
        known = ", ".join(repr(c) for c in list(mapping)[:8]) + (
            ", ..." if len(mapping) > 8 else ""
        )
        msg = (
            f"{where} has class(es) {', '.join(repr(u) for u in unknown)} that are not in the "
            f"given classes ({len(mapping)}: {known}). Every split must use the training classes: "
            "remove or rename "
            "the folder, or build the mapping from all splits."
        )
        raise DatasetError(msg)
    table = {label: mapping[name] for name, label in found.items()}
    return [table[label] for label in labels]


def _read_mapping(classes: Any) -> dict[str, int] | None:
    if classes is None:
        return None
    if isinstance(classes, (str, os.PathLike)):
        with open(classes, encoding="utf-8") as file:
            loaded = json.load(file)
        source = os.fspath(classes)
        classes = (
            (loaded.get("class_to_idx") or loaded.get("classes"))
            if isinstance(loaded, dict)
            else loaded
        )
        if classes is None:
            msg = (
                f"classes={source!r} must hold a list of class names, a {{name: label}} dict "
                "or an index with 'classes'"
            )
            raise ValueError(msg)
    if hasattr(classes, "class_to_idx") and not isinstance(classes, Mapping):
        classes = classes.class_to_idx
    if isinstance(classes, Mapping):
        pairs = list(classes.items())
    elif isinstance(classes, Sequence) and not isinstance(classes, (str, bytes)):
        pairs = [(name, label) for label, name in enumerate(classes)]
    else:
        msg = (
            "classes must be None, a list of names, a {name: label} dict or an index JSON path, "
            f"got {classes!r}"
        )
        raise TypeError(msg)
    mapping: dict[str, int] = {}
    for name, label in pairs:
        if not isinstance(name, str) or not is_int(label) or label < 0:
            msg = (
                f"classes must map class names (str) to labels (int >= 0); got {name!r}: {label!r}"
            )
            raise TypeError(msg)
        key = _nfc(name)
        if key in mapping:
            msg = f"classes lists {name!r} twice; each class needs one label"
            raise ValueError(msg)
        mapping[key] = int(label)
    if len(set(mapping.values())) != len(mapping):
        msg = f"classes gives two classes the same label: {mapping!r}"
        raise ValueError(msg)
    return mapping


class _LoadedIndex(dict[str, Any]):
    """A parsed index JSON that remembers its file, for error messages."""

    source = ""


def _describe_index(index: Any) -> str:
    if isinstance(index, (str, os.PathLike)):
        return f"index {os.fspath(index)!r}"
    if isinstance(index, _LoadedIndex):
        return f"index {index.source!r}"
    return "the given index"


def _load_index(path: str | os.PathLike[str]) -> Any:
    """Parses an index JSON file; a file that is not JSON raises naming it."""
    try:
        with open(path, encoding="utf-8") as file:
            loaded = json.load(file)
    except json.JSONDecodeError as exc:
        msg = (
            f"index {os.fspath(path)!r} is not valid JSON ({exc}); "
            "write it with ImageFolder.save_index"
        )
        raise DatasetError(msg) from exc
    if isinstance(loaded, dict):
        loaded = _LoadedIndex(loaded)
        loaded.source = os.fspath(path)
    return loaded


def _read_index(index: Any) -> tuple[list[str], list[int], dict[str, int]]:
    """(paths, labels, ``{class: label}``) of a saved index.

    The mapping is the index's ``class_to_idx`` when it has one, else ``classes`` in order
    (a plain ``{"classes", "items"}`` JSON index).
    """
    where = _describe_index(index)
    if isinstance(index, (str, os.PathLike)):
        index = _load_index(index)
    if (
        not isinstance(index, Mapping)
        or not isinstance(index.get("classes"), list)
        or not isinstance(index.get("items"), list)
    ):
        msg = (
            f'{where} must be a JSON object with "classes" (a list of names) and "items" '
            '(a list of {"path", "label"})'
        )
        raise DatasetError(msg)
    try:
        mapping = _read_mapping(index.get("class_to_idx") or index["classes"])
    except (TypeError, ValueError) as exc:
        msg = f"{where} has a malformed class list: {exc}"
        raise DatasetError(msg) from None
    if mapping is None:
        raise AssertionError("a class list always gives a mapping")
    valid = set(mapping.values())
    paths: list[str] = []
    labels: list[int] = []
    for position, item in enumerate(index["items"]):
        path = item.get("path") if isinstance(item, Mapping) else None
        label = item.get("label") if isinstance(item, Mapping) else None
        if not isinstance(path, str) or not is_int(label) or label not in valid:
            msg = (
                f'{where}: item {position} must be {{"path": str, "label": int}} with a label '
                "of one of its "
                f"{len(mapping)} classes, got {item!r}"
            )
            raise DatasetError(msg)
        paths.append(path)
        labels.append(label)
    return paths, labels, mapping


def _json_string(text: str) -> str:
    """JSON for ``text``, UTF-8 where possible (undecodable file names keep ``\\udcXX`` escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(text)
    return json.dumps(text, ensure_ascii=False)
