"""dataset_format/layout.py owns the file names: no module of the writer, the tools or the
readers spells one of them in a string literal of its own (docstrings and prose aside)."""

import ast
import pathlib

from dataset_format import layout

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("beam_pipeline", "readers", "loaders", "tf_quiet")
# Not checked: a generic extension (input manifests are .jsonl too), and the directory
# tf.Transform names (also the manifest's key for it).
UNCHECKED = {"JSONL", "TRANSFORM_FN", "KEY_SCHEME"}


def _names():
    names = {a: v for a, v in vars(layout).items()
             if a.isupper() and isinstance(v, str) and a not in UNCHECKED}
    names.update({f"TFDS_FILES[{i}]": v for i, v in enumerate(layout.TFDS_FILES)})
    return names


def _spells(text, name):
    """A literal spells `name` when it is the name, or a path with it as one component."""
    if " " in text:  # prose: help, messages
        return False
    if text == name:
        return True
    return text.startswith(name + "/") or text.endswith("/" + name) or f"/{name}/" in text


def _strings(tree):
    """The str constants of a module that are not docstrings or dict keys."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skip.add(id(body[0].value))
        elif isinstance(node, ast.Dict):
            skip.update(id(k) for k in node.keys if k is not None)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node


def _literals(names, root=REPO):
    """'file:line (layout attribute)' of each literal that spells a layout name."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for node in _strings(ast.parse(path.read_text())):
                spelt = [attr for attr, name in names.items() if _spells(node.value, name)]
                if spelt:  # one report a literal (two names may share a value)
                    found.append(f"{path.relative_to(root)}:{node.lineno} ({spelt[0]})")
    return found


def test_layout_names_are_spelt_only_in_layout():
    names = _names()
    assert {"TMP", "SHARD_INDEX", "LISTING", "LISTING_ERRORS", "DUPLICATES", "NEAR_DUPLICATES",
            "LOCK", "TFDS_DATASET_INFO", "CATALOG"} <= set(names)
    assert _literals(names) == []


def test_the_check_finds_a_literal(tmp_path):
    """The scan is real: code that spells a name is reported; docstrings and prose are not."""
    (tmp_path / "beam_pipeline").mkdir()
    (tmp_path / "beam_pipeline" / "x.py").write_text(
        '"""Writes shards.jsonl."""\n'
        'path = root + "/shards.jsonl"\n'
        'other = f"{vdir}/.tmp/x"\n'
        'print("see errors.jsonl for the reasons")  # prose\n'
        'temp = name + ".catalog.parquet"\n')
    assert _literals(_names(), tmp_path) == ["beam_pipeline/x.py:2 (SHARD_INDEX)",
                                             "beam_pipeline/x.py:3 (TMP)",
                                             "beam_pipeline/x.py:5 (FRAGMENT_SUFFIX)"]
