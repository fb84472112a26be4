"""ARCHITECTURE.md's checkable claims, read from the source (ast) or the CLI: only the Ray adapter
sub-package imports Ray, no private Ray API outside the few reaches ARCHITECTURE.md lists as known
debt, the three packages import in one direction (orchestrator -> results -> nli_models; nli_models
without MLflow), orchestrator/ is sub-packages that say their role, every module's name is unique
across the three packages, no module or function of orchestrator/ and results/ is too long, the
product reads no test-only variable, `nli.*` names live in one place, and every command reports
bad input through the one handler."""

from __future__ import annotations

import ast
import re

from testkit import REPO

PACKAGES = ("orchestrator", "results", "nli_models")
# The Ray adapter: the one sub-package whose modules may import Ray (ARCHITECTURE.md).
RAY_ADAPTER = "orchestrator/ray_adapter/"
# orchestrator/'s rooms (ARCHITECTURE.md): every module lives in one of them.
SUB_PACKAGES = {"cli", "cluster", "journal", "ray_adapter", "sweep", "tracking"}
# The private Ray names the adapter reaches for, each in one function, because Ray 2.60 has no
# public API for it (ARCHITECTURE.md, Known debt): (module, function, dotted name).
PRIVATE_RAY_REACHES = {
    ("orchestrator/ray_adapter/ray_runtime.py", "_start_deadline", "ray._private.services"),
    ("orchestrator/ray_adapter/ray_runtime.py", "autoscaling", "ray.autoscaler._private.util.format_readonly_node_type"),
    ("orchestrator/ray_adapter/ray_runtime.py", "_autoscaler_report", "ray._private.ray_constants.DEBUG_AUTOSCALING_STATUS"),
    ("orchestrator/ray_adapter/ray_runtime.py", "_autoscaler_report", "ray.experimental.internal_kv._internal_kv_get"),
}
# Which package may import which (the floors: none imports one above it).
MAY_IMPORT = {"orchestrator": set(PACKAGES), "results": {"results", "nli_models"}, "nli_models": {"nli_models"}}


def _modules():
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            yield path.relative_to(REPO).as_posix(), ast.parse(path.read_text(), str(path))


def _imports(tree: ast.AST):
    """(dotted name, enclosing function) of every import in `tree`, `from a import b` as a.b."""
    def walk(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Import):
                yield from ((alias.name, function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                yield from (((f"{child.module}.{alias.name}"), function) for alias in child.names)
            yield from walk(child, inner)
    yield from walk(tree, None)


def _ray_attributes(tree: ast.AST):
    """(dotted name, enclosing function) of every attribute chain that starts at `ray`."""
    def dotted(node):
        return f"{dotted(node.value)}.{node.attr}" if isinstance(node, ast.Attribute) else (
            node.id if isinstance(node, ast.Name) else "")

    def walk(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Attribute) and dotted(child).startswith("ray."):
                yield dotted(child), function
            else:
                yield from walk(child, inner)
    yield from walk(tree, None)


def _is_ray(name: str) -> bool:
    return name == "ray" or name.startswith("ray.")


def _private(name: str) -> bool:
    return any(part.startswith("_") for part in name.split("."))


def test_only_the_ray_adapter_imports_ray():
    outside = {(module, name) for module, tree in _modules() for name, _ in _imports(tree)
               if _is_ray(name) and not module.startswith(RAY_ADAPTER)}
    assert outside == set()
    inside = {module for module, tree in _modules() for name, _ in _imports(tree)
              if _is_ray(name) and module.startswith(RAY_ADAPTER)}
    assert len(inside) >= 4  # the rule looks where Ray's imports are


def test_orchestrator_is_sub_packages_that_state_their_role():
    """No module at orchestrator/'s top but its __init__; each sub-package's __init__ has a
    docstring (its role) and an explicit __all__ naming what it offers."""
    top = REPO / "orchestrator"
    assert sorted(path.name for path in top.glob("*.py")) == ["__init__.py"]
    folders = {path.parent.name for path in top.glob("*/*.py")}
    assert folders == SUB_PACKAGES
    import orchestrator

    assert set(orchestrator.__all__) == SUB_PACKAGES
    for name in sorted(SUB_PACKAGES):
        tree = ast.parse((top / name / "__init__.py").read_text())
        assert ast.get_docstring(tree), name
        offered = [node for node in tree.body if isinstance(node, ast.Assign)
                   and any(isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets)]
        assert len(offered) == 1 and ast.literal_eval(offered[0].value), name
        modules = {path.stem for path in (top / name).glob("*.py")} - {"__init__"}
        names = set(ast.literal_eval(offered[0].value))
        assert names == modules or not names & modules, name  # its modules, all of them, or names


def test_module_names_are_unique_across_the_packages():
    """One name, one module: `tracking.py` cannot mean two things in a traceback or a grep."""
    by_name: dict[str, list[str]] = {}
    for module, _ in _modules():
        if not module.endswith("/__init__.py"):
            by_name.setdefault(module.rsplit("/", 1)[1], []).append(module)
    assert {name: modules for name, modules in by_name.items() if len(modules) > 1} == {}


def test_no_private_ray_name_outside_the_listed_reaches():
    used = set()
    for module, tree in _modules():
        names = [*_imports(tree), *_ray_attributes(tree)]
        used |= {(module, function, name) for name, function in names if _is_ray(name) and _private(name)}
    assert used == PRIVATE_RAY_REACHES
    assert not any("_internal" in name.split(".") for _, _, name in used)  # Ray Train/Tune internals: never


# The size a reader can hold (ARCHITECTURE.md), in the packages a change most often touches.
SIZED = ("orchestrator", "results")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def test_no_module_is_over_450_lines():
    long = {module: lines for module, tree in _modules() if module.split("/")[0] in SIZED
            for lines in [len((REPO / module).read_text().splitlines())] if lines > MAX_MODULE_LINES}
    assert long == {}


def test_no_function_is_over_80_lines():
    """From `def` to its last line (decorators, a click command's options, not counted)."""
    long = {(module, node.name): node.end_lineno - node.lineno + 1
            for module, tree in _modules() if module.split("/")[0] in SIZED
            for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES}
    assert long == {}


def _private_attributes(tree: ast.AST):
    """(attribute chain, enclosing function) of every outermost chain that reaches a private
    attribute of an object other than `self`, `cls` or the `ray` module (those are Ray's names:
    test_no_private_ray_name_outside_the_listed_reaches) or `os` (os._exit is public)."""
    def private_step(node):
        while isinstance(node, ast.Attribute):
            if node.attr.startswith("_") and not node.attr.startswith("__") \
                    and ast.unparse(node.value) not in ("self", "cls", "os"):
                return True
            node = node.value
        return False

    def walk(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Attribute) and private_step(child):
                chain = ast.unparse(child)
                if not chain.startswith("ray."):
                    yield chain, function
            else:
                yield from walk(child, inner)
    yield from walk(tree, None)


def test_no_private_attribute_of_ray_objects():
    used = {(module, function, chain) for module, tree in _modules() if module.startswith(RAY_ADAPTER)
            for chain, function in _private_attributes(tree)}
    assert used == set()


def test_the_packages_import_one_way():
    upward = set()
    for module, tree in _modules():
        package = module.split("/")[0]
        upward |= {(module, name) for name, _ in _imports(tree)
                   if name.split(".")[0] in PACKAGES and name.split(".")[0] not in MAY_IMPORT[package]}
    assert upward == set()


def test_nli_models_knows_nothing_of_mlflow():
    """(and nothing of Ray: test_only_the_ray_adapter_imports_ray)"""
    users = {(module, name) for module, tree in _modules() if module.startswith("nli_models/")
             for name, _ in _imports(tree) if name.split(".")[0] == "mlflow"}
    assert users == set()


def test_the_product_reads_no_test_only_variable():
    """The delays and fault injection of tests live in tests/seams/sitecustomize.py."""
    import sitecustomize

    names = [value for name, value in vars(sitecustomize).items() if name.endswith("_ENV")]
    assert len(names) >= 4  # the epoch delay, the failure, the test-evaluation delay, the SIGINT at a stop
    readers = {path.relative_to(REPO).as_posix() for package in PACKAGES for path in (REPO / package).rglob("*.py")
               if any(name in path.read_text() for name in names)}
    assert readers == set()


# Where a literal `nli.*` name may be written: the tracked names (results/run_schema.py), the
# results files' own metadata keys (results/schema.py) and a Ray Job's metadata keys (ray_jobs.py).
NAME_HOMES = {"results/run_schema.py", "results/schema.py", "orchestrator/ray_adapter/ray_jobs.py"}
NAME = re.compile(r"nli\.[a-z_.]+")


def test_names_live_in_one_place():
    literals = {(module, node.value) for module, tree in _modules() if module not in NAME_HOMES
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value)}
    assert literals == set()


def _leaf_commands(group, path=()):
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from _leaf_commands(command, (*path, name))
        else:
            yield (*path, name), command


def _input_error_classes():
    """Every bad-input exception of the project: InputError and its subclasses (one hierarchy)."""
    import nli_models.config  # noqa: F401 (the modules that define them)
    import nli_models.models.arguments  # noqa: F401
    import orchestrator.cluster.slurm  # noqa: F401
    import orchestrator.cluster.tracking_server  # noqa: F401
    import results.results_errors  # noqa: F401
    from nli_models.errors import InputError

    found, todo = [], [InputError]
    while todo:
        kind = todo.pop()
        found.append(kind)
        todo += kind.__subclasses__()
    return found


def test_every_command_reports_bad_input_through_the_one_handler(monkeypatch):
    """Whatever bad-input class a command raises: `error: MESSAGE` on stderr and exit 2, the same
    line for every command (orchestrator.cli.orchestrate._Commands, the one handler)."""
    from click.testing import CliRunner

    from orchestrator.cli.orchestrate import main

    classes = _input_error_classes()
    assert {kind.__name__ for kind in classes} >= {"ResultsError", "JobInputError", "ServerInputError",
                                                    "ModelArgumentError", "SlurmInputError", "ConfigError"}
    commands = list(_leaf_commands(main))
    assert len(commands) > 15
    for path, command in commands:
        for kind in classes:
            def fail(*args, kind=kind, path=path, **kwargs):
                raise kind(f"bad {kind.__name__} for {' '.join(path)}; password://u:secret@h")

            with monkeypatch.context() as patch:
                patch.setattr(command, "params", [])
                patch.setattr(command, "callback", fail)
                result = CliRunner().invoke(main, list(path))
            assert result.exit_code == 2, (path, kind, result.output)
            assert result.stderr == f"error: bad {kind.__name__} for {' '.join(path)}; password://u:***@h\n", path
