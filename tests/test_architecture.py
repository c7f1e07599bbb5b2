"""The package's shape: each subpackage imports only the layers below it.

zkbeat/ is arranged so that what a module may use is visible from where it
lives: conf, exceptions, _decode (reading JSON anyone may have written) and
_collector (the garbage collector held off) at the bottom; ticking (what a tick is) and
coordination (who leads) on them, apart; the ledger (what ran) on those;
leading (one shard's term: plan, claim, publish) on the ledger; ops (the
command, status, metrics, dashboard) beside leading; the scheduler (Celery's
glue) on all of it, and contrib (Django) on top. An import against that
direction, even one only for type checking, is how the old circle
scheduler -> term -> publisher -> scheduler came about; this test names it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import zkbeat

PACKAGE = Path(zkbeat.__file__).parent

#: Each part of the package and the parts it may import (besides itself).
ALLOWED = {
    "zkbeat.conf": {"zkbeat.exceptions"},
    "zkbeat.exceptions": set(),
    "zkbeat._decode": set(),
    "zkbeat._collector": set(),
    "zkbeat.ticking": {"zkbeat.conf", "zkbeat.exceptions", "zkbeat._decode", "zkbeat._collector"},
    "zkbeat.coordination": {"zkbeat.conf", "zkbeat.exceptions", "zkbeat._decode", "zkbeat._collector"},
    "zkbeat.ledger": {
        "zkbeat.conf",
        "zkbeat.exceptions",
        "zkbeat._decode",
        "zkbeat._collector",
        "zkbeat.ticking",
        "zkbeat.coordination",
    },
    "zkbeat.leading": {
        "zkbeat.conf",
        "zkbeat.exceptions",
        "zkbeat._decode",
        "zkbeat._collector",
        "zkbeat.ticking",
        "zkbeat.coordination",
        "zkbeat.ledger",
    },
    "zkbeat.ops": {
        "zkbeat.conf",
        "zkbeat.exceptions",
        "zkbeat._decode",
        "zkbeat._collector",
        "zkbeat.ticking",
        "zkbeat.coordination",
        "zkbeat.ledger",
        "zkbeat._version",
    },
}


def _part(module: str) -> str:
    """The part of the package a dotted module name belongs to."""
    parts = module.split(".")
    if len(parts) == 1:
        return module
    return ".".join(parts[:2])


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every zkbeat module ``path`` imports (type-checking imports too), with its line."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "zkbeat"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "zkbeat":
                continue
            if node.module is None or target == "zkbeat" or target.count(".") == 1 and _is_package(target):
                # from . import x / from ..ledger import store: the names are modules (or attributes)
                found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, target))
    return found


def _is_package(dotted: str) -> bool:
    return (PACKAGE.parent / dotted.replace(".", "/") / "__init__.py").exists()


def test_each_part_imports_only_the_parts_below_it():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = _part(_module_name(path))
        if source not in ALLOWED:
            continue  # the scheduler, contrib and the package's root may use every part
        for line, target in _imports(path):
            dest = _part(target)
            if dest == source or dest in ALLOWED[source]:
                continue
            if target == "zkbeat.__version__":
                continue
            wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({source}) imports {target}")
    assert not wrong, "imports against the package's layers:\n" + "\n".join(wrong)


def test_the_parts_exist_and_hold_what_the_layers_name():
    # A renamed subpackage would leave this test checking nothing.
    for part in ALLOWED:
        name = part.split(".", 1)[1]
        assert (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").exists(), part
    assert len(list((PACKAGE / "leading").glob("*.py"))) > 3


def test_the_scheduler_module_is_celery_glue():
    # The leadership it drives lives in zkbeat.leading; what stays is beat's hooks.
    lines = (PACKAGE / "scheduler.py").read_text().splitlines()
    assert len(lines) < 400, f"zkbeat/scheduler.py has {len(lines)} lines"


def test_a_term_and_its_publisher_never_reach_back_into_the_scheduler():
    # They get their collaborators when they are made (zkbeat.leading.host). (Celery's
    # own log line "Scheduler: Sending due task ..." is kept as beat writes it.)
    for name in ("term.py", "publisher.py"):
        text = (PACKAGE / "leading" / name).read_text()
        assert "scheduler" not in text, f"zkbeat/leading/{name} mentions the scheduler"
