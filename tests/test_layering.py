"""The import graph a reader can trust: no cycles (between modules, and between packages), primitives at the
bottom, the library below the transport, the parties, the tools and the console script.

Read from the source (``ast``), not by importing: an import inside a function
counts as much as one at the top, and so does an import by string (a command
table's ``"secure_afl.x.y:function"``, ``importlib.import_module("...")``),
since each ties the two modules together all the same.
"""

from __future__ import annotations

from support import sourcetree as st

# what the primitives may lean on: leaf modules that import nothing above themselves
HAZMAT_MAY_IMPORT = {"secure_afl.exceptions", "secure_afl._validation", "secure_afl.domains"}
# installed sub-packages that are not library: the parties' transport, the parties, the tools, the console script
TRANSPORT = ("secure_afl.transport",)
ABOVE_LIBRARY = TRANSPORT + ("secure_afl.server", "secure_afl.clients", "secure_afl.keyholder", "secure_afl.consortium",
                             "secure_afl.flower", "secure_afl_tools", "secure_afl.cli")
TOOLS = ("secure_afl.flower", "secure_afl_tools")


def _under(name: str, packages) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _graph() -> dict[str, set[str]]:
    graph = {name: set() for name in st.modules()}
    for m in st.modules().values():
        for _, target in st.all_imports(m):
            if target != m.name:
                graph[m.name].add(target)
    return graph


def _package(name: str) -> str:
    """The package a module belongs to at the top of the product: secure_afl.backends for
    secure_afl.backends.ckks, secure_afl.server for secure_afl.server.routes.gate; a module directly in
    secure_afl stands for itself."""
    return ".".join(name.split(".")[:2])


def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, targets in _graph().items():
        graph.setdefault(_package(name), set()).update(_package(t) for t in targets)
    for name, targets in graph.items():
        targets.discard(name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_two_module_cycle():
    # the check below is only as good as this function: a planted cycle must be reported
    assert _cycles({"a": {"b"}, "b": {"a", "c"}, "c": set()}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_package_level_cycles():
    # two packages that import each other (backends <-> secagg, say) cannot be read, tested or shipped apart,
    # even when no two of their modules form a cycle
    cycles = _cycles(_package_graph())
    assert not cycles, "package-level import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_an_import_by_string_is_an_import():
    # the string finder must see what a command table or importlib names, and only that
    import ast

    known = {"secure_afl_tools.demo", "secure_afl.cli", "secure_afl.server"}
    tree = ast.parse('''"""Docstring naming secure_afl_tools.demo."""
import importlib, logging, subprocess, sys
log = logging.getLogger("secure_afl.server")
TABLE = [("demo", "secure_afl_tools.demo:register")]
importlib.import_module("secure_afl_tools.demo")
subprocess.Popen([sys.executable, "-m", "secure_afl.cli", "server"])
''')
    assert sorted(st.string_imports_in(tree, known)) == [(4, "secure_afl_tools.demo"), (5, "secure_afl_tools.demo")]


def test_hazmat_imports_nothing_above_it():
    offences = [f"{m.name} -> {t}" for m in st.modules().values() if _under(m.name, ["secure_afl.hazmat"])
                for _, t in st.all_imports(m)
                if not _under(t, ["secure_afl.hazmat"]) and t not in HAZMAT_MAY_IMPORT]
    assert not offences, "hazmat imports above itself:\n" + "\n".join(offences)


def test_the_library_imports_no_party_and_no_tool():
    offences = [f"{m.name}:{line} -> {t}" for m in st.modules().values() if not _under(m.name, ABOVE_LIBRARY)
                for line, t in st.all_imports(m) if _under(t, ABOVE_LIBRARY)]
    assert not offences, "the library imports a party, a tool, the transport or the console script:\n" + \
        "\n".join(offences)


def test_the_transport_imports_only_the_library():
    offences = [f"{m.name}:{line} -> {t}" for m in st.modules().values() if _under(m.name, TRANSPORT)
                for line, t in st.all_imports(m) if _under(t, ABOVE_LIBRARY) and not _under(t, TRANSPORT)]
    assert not offences, "the transport imports a party or a tool:\n" + "\n".join(offences)


def test_no_party_imports_a_tool():
    # the console script names every command, tools' included: it alone sits above them
    offences = [f"{m.name}:{line} -> {t}" for m in st.modules().values()
                if _under(m.name, ABOVE_LIBRARY) and not _under(m.name, TOOLS + ("secure_afl.cli",))
                for line, t in st.all_imports(m) if _under(t, TOOLS)]
    assert not offences, "a party imports a tool:\n" + "\n".join(offences)


def _library_imports_of(top_level: set[str]) -> list[str]:
    """``module: name`` for every absolute import, in a library module, of a package in ``top_level``."""
    import ast

    offences = []
    for m in st.modules().values():
        if _under(m.name, ABOVE_LIBRARY):
            continue
        for node in ast.walk(m.tree()):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            offences += [f"{m.name}: {n}" for n in names if n.partition(".")[0] in top_level]
    return offences


def test_the_library_has_no_network_code():
    offences = _library_imports_of({"fastapi", "starlette", "httpx", "uvicorn", "requests", "socket", "flwr"})
    assert not offences, "network code in the library:\n" + "\n".join(offences)


def test_no_private_name_is_imported_across_modules():
    import ast

    offences = []
    for m in st.modules().values():
        for node in ast.walk(m.tree()):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = st.resolve(m, node)
            if base not in st.modules() or base == m.name:
                continue
            # a package's own __init__ may gather its submodules' names
            if m.is_package and base.startswith(m.name + "."):
                continue
            offences += [f"{m.name}:{node.lineno}: {base}.{a.name}" for a in node.names
                         if a.name.startswith("_") and not a.name.startswith("__")]
    assert not offences, "private names imported across modules:\n" + "\n".join(offences)


def test_no_two_modules_share_a_file_name_for_different_jobs():
    # the same name for the same job in each party's folder is fine: their command lines, and a package's
    # `python -m` entry point
    same_job = {"__init__", "cli", "__main__"}
    seen: dict[str, list[str]] = {}
    for m in st.modules().values():
        if not m.is_package and m.path.stem not in same_job:
            seen.setdefault(m.path.stem, []).append(m.name)
    # a protection backend is named after the scheme it wraps: backends/ckks.py over hazmat/ckks.py is one job
    # in two layers (the backend's policy, the primitive)
    layered = lambda stem, names: sorted(names) == [f"secure_afl.backends.{stem}", f"secure_afl.hazmat.{stem}"]
    dupes = {k: v for k, v in seen.items() if len(v) > 1 and not layered(k, v)}
    assert not dupes, f"file names used by several modules: {dupes}"


def test_the_server_admits_an_upload_through_the_backend_interface_naming_no_backend():
    # a sixth backend adds its own ProtectionBackend.admit; the server's upload path does not change
    import ast

    from secure_afl.params import BACKENDS

    mods = st.modules()
    # the one upload path: the only server module defining ``submit`` (a subclass redefining it would dodge this)
    defining = sorted(name for name, m in mods.items() if _under(name, ("secure_afl.server",))
                      and any(isinstance(n, ast.FunctionDef) and n.name == "submit" for n in ast.walk(m.tree())))
    assert defining == ["secure_afl.server.intake"], defining
    # and the module holding it names no backend anywhere, in the upload path or beside it
    tree = mods["secure_afl.server.intake"].tree()
    named = sorted({n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in BACKENDS} |
                   {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id.endswith("_BACKENDS")} |
                   {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names
                    if a.name.endswith("_BACKENDS")} |
                   {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "backend"})
    assert not named, f"the server's upload module names backends: {named}"
    submit = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "submit")
    calls = {n.func.attr for n in ast.walk(submit) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert "admit" in calls


def test_the_library_holds_no_command_line_code():
    # argparse belongs to the console script and the parties' cli modules; the library is called, not run
    offences = _library_imports_of({"argparse"})
    assert not offences, "argparse in the library:\n" + "\n".join(offences)


def test_the_hospital_party_imports_nothing_of_the_key_holders():
    # a hospital reads a model file through the library (secure_afl.model_file), never the key holder's code
    offences = [f"{name} -> {t}" for name, targets in _graph().items() if _under(name, ("secure_afl.clients",))
                for t in targets if _under(t, ("secure_afl.keyholder",))]
    assert not offences, "\n".join(offences)


def test_the_proof_system_names_no_statement():
    # split's proof system is generic over its statement: it reads the session's through the one interface
    # (session_statement.statement_for builds it), so a new relation or statement never edits proof.py. Every class the
    # statements module defines is a statement or a view of one; proof.py may import the views and the factory,
    # and may name no statement class, in an import or anywhere in its code
    import ast

    mods = st.modules()
    proof = mods["secure_afl.split.proof"]
    classes = {n.name for name in ("secure_afl.split.statements", "secure_afl.split.gram_statement")
               for n in ast.walk(mods[name].tree()) if isinstance(n, ast.ClassDef)}
    views = {"Prover", "Shares", "Unlucky"}
    named = {n.id for n in ast.walk(proof.tree()) if isinstance(n, ast.Name)} | \
        {n.attr for n in ast.walk(proof.tree()) if isinstance(n, ast.Attribute)} | \
        {a.asname or a.name for n in ast.walk(proof.tree()) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert classes - views, "the statements module defines no statement class"
    assert not (named & (classes - views)), f"proof.py names statement classes: {sorted(named & (classes - views))}"


# the server's session: one object whose state is declared in server/session_state.py; each stage a module of
# functions over it, as the key holder's release is one SessionRelease with a function per path
SESSION_STATE = "secure_afl.server.session_state"
SESSION_CLASS = "ServerSession"


def _declared(tree) -> dict[str, tuple[set[str], set[str]]]:
    """class -> (fields, properties) for every class of a module: annotated class-level names are its fields."""
    import ast

    out = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        props = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)
                 and any(isinstance(d, ast.Name) and d.id == "property" for d in n.decorator_list)}
        out[cls.name] = (fields, props)
    return out


def _session_state_offences(tree, declared: dict[str, tuple[set[str], set[str]]], where: str) -> list[str]:
    """Every use, in ``tree``, of a parameter annotated as the session object that the state module does not
    declare: ``session.x`` read or set where ``x`` is no field (or, for a read, no property) of the object, and
    ``session.secagg.x`` / ``session.split.x`` likewise for the sub-states the object declares by type; and every
    ``__dict__`` (state kept where no declaration shows it)."""
    import ast

    fields, props = declared[SESSION_CLASS]
    # the sub-states: a field annotated ``SomeState | None`` whose class the state module declares
    state_mod_classes = set(declared)
    offences = [f"{where}:{n.lineno}: __dict__" for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and n.attr == "__dict__"]
    sub = {}
    for cls in ast.walk(ast.parse(_SESSION_SOURCE())):
        if isinstance(cls, ast.ClassDef) and cls.name == SESSION_CLASS:
            for n in cls.body:
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                    names = {x.id for x in ast.walk(n.annotation) if isinstance(x, ast.Name)} & state_mod_classes
                    if names:
                        sub[n.target.id] = names.pop()
    for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        params = [a for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs
                  if a.annotation is not None and SESSION_CLASS in ast.unparse(a.annotation)]
        for param in params:
            for n in ast.walk(fn):
                if not (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == param.arg):
                    continue
                stored = isinstance(n.ctx, (ast.Store, ast.Del))
                if n.attr not in fields and (stored or n.attr not in props):
                    offences.append(f"{where}:{n.lineno}: {param.arg}.{n.attr} "
                                    f"({'set' if stored else 'read'}, not declared by {SESSION_CLASS})")
            for n in ast.walk(fn):  # session.secagg.x: declared by the sub-state's class
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and \
                        isinstance(n.value.value, ast.Name) and n.value.value.id == param.arg and n.value.attr in sub:
                    sfields, sprops = declared[sub[n.value.attr]]
                    stored = isinstance(n.ctx, (ast.Store, ast.Del))
                    if n.attr not in sfields and (stored or n.attr not in sprops):
                        offences.append(f"{where}:{n.lineno}: {param.arg}.{n.value.attr}.{n.attr} "
                                        f"(not declared by {sub[n.value.attr]})")
    return offences


def _SESSION_SOURCE() -> str:
    return st.modules()[SESSION_STATE].path.read_text()


def _server_modules():
    return {name: m for name, m in st.modules().items() if _under(name, ("secure_afl.server",))}


def test_the_server_session_state_is_declared_in_one_place():
    import ast

    declared = _declared(ast.parse(_SESSION_SOURCE()))
    assert SESSION_CLASS in declared and "in_flight" in declared[SESSION_CLASS][0]
    offences = []
    for name, m in _server_modules().items():
        offences += _session_state_offences(m.tree(), declared, name)
    assert not offences, "server state not declared by the session object:\n" + "\n".join(offences)


def test_no_server_stage_is_a_class_or_keeps_state_of_its_own():
    # a stage is functions over the session object: no mixin sharing ``self``, no subclass per backend, and
    # nothing kept at module level between calls (a cache there is state no declaration shows)
    import ast

    stages = ("peer_auth", "intake", "running_sum", "audit_records", "closing", "split_round", "secagg_round",
              "aggregator", "status")
    offences = []
    for stage in stages:
        tree = st.modules()[f"secure_afl.server.{stage}"].tree()
        offences += [f"{stage}: class {n.name}" for n in tree.body if isinstance(n, ast.ClassDef)]
        for n in tree.body:
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
            offences += [f"{stage}:{n.lineno}: module-level {t.id}" for t in targets if isinstance(t, ast.Name)
                         and not (t.id.isupper() or t.id.lstrip("_").isupper() or t.id in ("log", "__all__"))]
        offences += [f"{stage}:{n.lineno}: global {', '.join(n.names)}" for n in ast.walk(tree)
                     if isinstance(n, ast.Global)]
    assert not offences, "\n".join(offences)


def test_the_session_state_check_sees_an_undeclared_attribute():
    # the two checks above are only as good as this: a planted undeclared field, a sub-state's undeclared field
    # and a __dict__ cache must each be reported, and the declared ones must not
    import ast

    declared = _declared(ast.parse(_SESSION_SOURCE()))
    planted = ast.parse('''
def stage(session: ServerSession, x):
    session.in_flight.add(x)
    session.cache = {}
    session.secagg.round = None
    session.secagg.pending = 1
    return session.status, session.__dict__.get("pool")
''')
    found = _session_state_offences(planted, declared, "planted")
    assert sorted(f.split(": ", 1)[1].split(" ")[0] for f in found) == \
        ["__dict__", "session.__dict__", "session.cache", "session.secagg.pending"]


def test_no_module_of_the_library_or_a_party_is_over_600_lines():
    # one job per module: a module past this size is doing several (the tools, which are not installed by any
    # party, are not held to it)
    big = {m.name: n for m in st.modules().values() if not _under(m.name, ("secure_afl_tools",))
           if (n := len(m.path.read_text().splitlines())) > 600}
    assert not big, f"modules over 600 lines: {big}"
