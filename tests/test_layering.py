"""The arrows between the project's rooms, stated once and checked on every import.

A room is a folder that says where its code runs (docs/architecture.md): the launcher, the
job on Beam workers, the dataset root's store, dedup, plain algorithms, the tools, the
neutral on-disk format, and the two training sides. `shared` is what sits below the build's
rooms at the top of `beam_pipeline/` (refs, errors, defaults, kinds, manifest_text). An
import that points up is a back-edge: it makes two rooms one, and this test names it.

An import inside a function hides a dependency from the top of the file. Inside the
package it is allowed only with a one-line reason, a comment on its line or the line above
(e.g. `# lazy: --help answers before Beam loads`): a cost that importing at the top would
add, or a cycle.
"""

import ast
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("beam_pipeline", "dataset_format", "readers", "loaders", "tf_quiet")
BUILD_ROOMS = ("launcher", "job", "store", "dedup", "algorithms", "tools")

# room -> the rooms it may import (besides itself). Arrows point one way: down.
ALLOWED = {
    "cli": {"launcher", "store", "shared", "dataset_format", "tf_quiet"},
    "launcher": {"job", "store", "dedup", "algorithms", "shared", "dataset_format", "tf_quiet"},
    "job": {"store", "dedup", "algorithms", "shared", "dataset_format"},
    "dedup": {"store", "algorithms", "shared", "dataset_format"},
    "store": {"algorithms", "shared", "dataset_format"},
    "tools": {"store", "dedup", "algorithms", "shared", "dataset_format", "tf_quiet"},
    "algorithms": set(),
    "shared": {"dataset_format", "tf_quiet"},
    "dataset_format": set(),
    "readers": {"dataset_format", "tf_quiet"},
    "loaders": {"dataset_format"},
    "tf_quiet": set(),
}


def room(module):
    """beam_pipeline.job.shards -> "job"; beam_pipeline.cli -> "cli"; readers.x -> "readers"."""
    parts = module.split(".")
    if parts[0] != "beam_pipeline":
        return parts[0]
    if len(parts) > 1 and parts[1] in BUILD_ROOMS:
        return parts[1]
    if len(parts) > 1 and parts[1] in ("cli", "__main__"):
        return "cli"
    return "shared"


def _modules():
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            yield module.removesuffix(".__init__"), path


def _imports(module, path):
    """(imported module, line number, inside a function, its line, the line above) for each
    import of the project's own packages."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(n) for n in ast.walk(node) if n is not node)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[:len(base) - node.level + (path.name == "__init__.py")]
                targets = [".".join(base + ([node.module] if node.module else []))]
            else:
                targets = [node.module]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in PACKAGES:
                yield (target, node.lineno, id(node) in in_function, lines[node.lineno - 1],
                       lines[node.lineno - 2] if node.lineno > 1 else "")


ALL = [(m, p, *imp) for m, p in _modules() for imp in _imports(m, p)]


def test_every_arrow_points_down():
    back = [f"{p.relative_to(REPO)}:{line}: {room(m)} -> {room(t)} ({t})"
            for m, p, t, line, _, _, _ in ALL
            if room(m) != room(t) and room(t) not in ALLOWED[room(m)]]
    assert back == [], "back-edges:\n" + "\n".join(back)


def test_a_function_local_import_of_the_package_says_why():
    silent = [f"{p.relative_to(REPO)}:{line}: {text.strip()}"
              for m, p, t, line, local, text, above in ALL
              if local and "#" not in text and not above.strip().startswith("#")]
    assert silent == [], ("imports inside functions without a reason on their line or the "
                          "line above (import at the top, or say why not):\n" + "\n".join(silent))


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_every_room_exists(name):
    """The table names real rooms: a renamed folder fails here, not silently passes."""
    assert any(room(m) == name for m, _ in _modules())


def test_the_rule_sees_a_back_edge():
    assert room("beam_pipeline.dedup.leaks") == "dedup"
    assert "job" not in ALLOWED["dedup"] and "launcher" not in ALLOWED["tools"]
    assert "readers" not in ALLOWED["job"] and "beam_pipeline" not in ALLOWED["readers"]


def test_the_tests_index_lists_every_module_and_only_real_test_files():
    """tests/README.md: a module's tests are found by its row there."""
    index = (REPO / "tests" / "README.md").read_text()
    rows = dict(re.findall(r"^\| `([^`]+\.py)` \| (.+) \|$", index, re.M))
    modules = {str(p.relative_to(REPO)) for _, p in _modules()
               if p.name != "__main__.py" and (p.name != "__init__.py" or p.parent.name == "tf_quiet")}
    assert sorted(modules - set(rows)) == [], "modules missing from tests/README.md"
    assert sorted(set(rows) - modules) == [], "tests/README.md lists modules that are gone"
    named = {name for cell in rows.values() for name in re.findall(r"`(test_[^`]+\.py)`", cell)}
    assert named and sorted(n for n in named if not (REPO / "tests" / n).exists()) == []


def test_no_call_of_the_projects_own_functions_passes_more_than_six_positional_arguments():
    """Past a handful, arguments are named (or travel as a frozen value): a call reads
    without the signature beside it, and a reordered signature fails loudly."""
    trees = [(p, ast.parse(p.read_text())) for _, p in _modules()]
    ours = {n.name for _, t in trees for n in ast.walk(t)
            if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    wide = [f"{p.relative_to(REPO)}:{n.lineno}: {len(n.args)} positional"
            for p, t in trees for n in ast.walk(t)
            if isinstance(n, ast.Call) and len(n.args) > 6
            and getattr(n.func, "id", getattr(n.func, "attr", None)) in ours
            and getattr(getattr(n.func, "value", None), "id", None) not in ("log", "logging")]
    assert wide == [], "\n".join(wide)
