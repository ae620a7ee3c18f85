"""The template language of a model file (``ref``, ``source``, ``config``, comments), compiled to one
SQL statement whose offsets map back to the file; the pattern/SQL classification; ``compile`` output."""
from __future__ import annotations

import ast
import re

from matchrec import errors as E
from matchrec.engine.project.models import (_IDENT, _RELATION, MATERIALIZATIONS, PROJECT_FILE, Model, Project, _normalise,
                                            _quote)
from matchrec.parser.source import Origin, rewrite

_OPEN = re.compile(r"\{\{|\{%|\{#")


def _compile_model(model: Model, project: Project, reserved: frozenset[str], errors: list[E.Error]) -> None:
    """Expand the templates of ``model`` into ``model.sql``; record refs, sources and config. An
    error in one template construct is added to ``errors`` and the next one is read all the same."""
    text = model.text
    edits: list[tuple[int, int, str]] = []
    found: list[E.Error] = []
    pos = 0
    while True:
        m = _OPEN.search(text, pos)
        if m is None:
            break
        start = m.start()
        kind = m.group()
        close = {"{{": "}}", "{%": "%}", "{#": "#}"}[kind]
        end = text.find(close, m.end())
        if end < 0:
            errors += found + [model.error(f"{kind} is not closed by {close}", start, start + 2)]
            return
        end += 2
        pos = end
        if kind == "{%":
            found.append(model.error("Template statements ({% ... %}) are not supported: only {{ ref() }}, "
                                     "{{ source() }} and {{ config() }}", start, end))
        elif kind == "{#":
            edits.append((start, end, "\n" * text.count("\n", start, end)))
        else:
            try:
                edits.append((start, end, _expand(model, project, reserved, start, end)))
            except E.ProgrammingError as err:
                found.append(err)
    if found:
        errors += found
        return
    sql, origin = rewrite(text, edits)
    model.sql, model.origin = _single_statement(model, sql, origin), origin
    if not model.sql.strip() or _only_comments(model.sql):
        raise model.error("the model has no SQL statement")
    _classify(model)
    if model.pattern and model.materialized == "view":
        raise model.error("a pattern model (MATCH_RECOGNIZE or a CER statement) cannot be materialized as a view: "
                          "DuckDB cannot evaluate the pattern inside a view; use 'table' or 'parquet'",
                          model.config_at)


def _expand(model: Model, project: Project, reserved: frozenset[str], start: int, end: int) -> str:
    """The replacement text of the ``{{ ... }}`` at ``model.text[start:end]``."""
    inner_start = start + 2
    inner = model.text[inner_start:end - 2]
    if inner.startswith("-"):  # whitespace control markers change nothing that matters to SQL
        inner, inner_start = " " + inner[1:], inner_start
    if inner.endswith("-"):
        inner = inner[:-1] + " "
    stripped = inner.strip()
    if not stripped:
        raise model.error("Empty template expression {{ }}", start, end)
    lead = len(inner) - len(inner.lstrip())
    expr_at = inner_start + lead
    try:
        node = ast.parse(stripped, mode="eval").body
    except SyntaxError as err:
        at = expr_at + _char_offset(stripped, err.lineno or 1, (err.offset or 1) - 1)
        raise model.error(f"Cannot read the template expression {stripped!r}: only ref('model'), "
                          "source('table') and config(...) are supported", at) from None

    def at(n: ast.AST) -> tuple[int, int]:
        a = expr_at + _char_offset(stripped, n.lineno, n.col_offset)
        b = expr_at + _char_offset(stripped, n.end_lineno or n.lineno, n.end_col_offset or n.col_offset)
        return a, b

    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("ref", "source", "config")):
        a, b = at(node)
        raise model.error(f"Unknown template construct {stripped!r}: only ref('model'), source('table') and "
                          "config(...) are supported", a, b)
    func = node.func.id
    if func == "config":
        return _config(model, node, at, start, end)
    if node.keywords:
        a, b = at(node.keywords[0].value)
        raise model.error(f"{func}() takes no keyword arguments", a, b)
    args = []
    for arg in node.args:
        if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
            a, b = at(arg)
            raise model.error(f"{func}() takes names as quoted strings", a, b)
        args.append(arg.value)
    if func == "ref":
        if len(args) != 1:
            raise model.error("ref() takes one model name: ref('model')", *at(node))
        target = project.models.get(args[0].lower())
        if target is None:
            raise model.error(f"Unknown model {args[0]!r} in ref(); models: {', '.join(sorted(project.models))}",
                              *at(node.args[0]))
        model.refs.setdefault(target.key, start)
        return target.relation
    if len(args) not in (1, 2) or not all(_IDENT.fullmatch(a) for a in args):
        raise model.error("source() takes a table name, or a schema and a table name, each a plain identifier: "
                          "source('events') or source('raw', 'events')", *at(node))
    relation = ".".join(_quote(a, reserved) for a in args)
    if project.declared_sources is not None and _normalise(relation) not in project.declared_sources:
        raise model.error(f"Source {'.'.join(args)!r} is not declared in {PROJECT_FILE} (sources: "
                          f"{', '.join(project.declared_sources) or 'none'})", *at(node))
    model.sources.append((relation, start))
    return relation


def _config(model: Model, node: ast.Call, at, start: int, end: int) -> str:
    if model.config_at is not None:
        raise model.error("config() appears twice in one model", start, end)
    model.config_at = start
    if node.args:
        raise model.error("config() takes keyword arguments: config(materialized='table', tags=['x'])",
                          *at(node.args[0]))
    for kw in node.keywords:
        if kw.arg is None:
            raise model.error("config() takes keyword arguments", *at(kw.value))
        value = _literal(kw.value)
        if kw.arg == "materialized":
            if value not in MATERIALIZATIONS:
                raise model.error(f"materialized must be one of {', '.join(MATERIALIZATIONS)}, got {value!r}",
                                  *at(kw.value))
            model.materialized = value
        elif kw.arg == "tags":
            if isinstance(value, str):
                value = [value]
            if not (isinstance(value, list) and value and all(isinstance(t, str) and t for t in value)):
                raise model.error("tags must be a string or a list of strings", *at(kw.value))
            model.tags = tuple(dict.fromkeys(value))
        else:
            a = at(kw.value)[0] - len(kw.arg) - 1
            raise model.error(f"Unknown config key {kw.arg!r}; known: materialized, tags", max(start, a))
    return "\n" * model.text.count("\n", start, end)


_NOT_LITERAL = object()


def _literal(node: ast.AST):
    """The value of a literal argument (Jinja's true/false/none included); _NOT_LITERAL otherwise."""
    if isinstance(node, ast.Name) and node.id.lower() in ("true", "false", "none"):
        return {"true": True, "false": False, "none": None}[node.id.lower()]
    if isinstance(node, ast.List):
        items = [_literal(e) for e in node.elts]
        return _NOT_LITERAL if _NOT_LITERAL in items else items
    if isinstance(node, ast.Constant):
        return node.value
    return _NOT_LITERAL


def _char_offset(text: str, lineno: int, byte_col: int) -> int:
    """The character offset in ``text`` of ast's (1-based line, UTF-8 byte column)."""
    lines = text.split("\n")
    before = sum(len(x) + 1 for x in lines[:lineno - 1])
    line = lines[lineno - 1] if lineno - 1 < len(lines) else ""
    return before + len(line.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))


def _single_statement(model: Model, sql: str, origin: Origin) -> str:
    """``sql`` with a trailing semicolon blanked out; a second statement is an error."""
    from sqlglot.dialects.dialect import Dialect
    from sqlglot.tokens import TokenType
    try:
        tokens = Dialect.get_or_raise("duckdb").tokenize(sql)
    except Exception:  # noqa: BLE001 - the statement's own run reports what is wrong with it
        return sql
    for i, tok in enumerate(tokens):
        if tok.token_type == TokenType.SEMICOLON:
            if i + 1 < len(tokens):
                raise model.error("A model is one SQL statement; this is a second one", origin.map(tokens[i + 1].start))
            return sql[:tok.start] + " " + sql[tok.end + 1:]
    return sql


def _only_comments(sql: str) -> bool:
    return not re.sub(r"--[^\n]*|/\*.*?\*/|\s+", "", sql, flags=re.S)


def _classify(model: Model) -> None:
    """Is the model a pattern model, and does it read one relation only (then it may share a pass)?

    Decided on tokens, without parsing the pattern (the run parses it and reports its errors).
    """
    from matchrec.parser import sase
    sql = model.sql
    if sase.is_cer_statement(sql):
        model.pattern = True
        m = _SASE_FROM.search(_strip_comments(sql))
        model.pattern_source = _normalise(m.group(1)) if m else None
        return
    if "match_recognize" not in sql.lower():
        return
    from sqlglot.dialects.dialect import Dialect
    from sqlglot.tokens import TokenType
    try:
        tokens = Dialect.get_or_raise("duckdb").tokenize(sql)
    except Exception:  # noqa: BLE001 - the run reports what is wrong with the statement
        model.pattern = True
        return
    clauses = [i for i, t in enumerate(tokens) if t.text.upper() == "MATCH_RECOGNIZE"
               and t.token_type not in (TokenType.STRING, TokenType.IDENTIFIER)
               and i + 1 < len(tokens) and tokens[i + 1].token_type == TokenType.L_PAREN]
    model.pattern = bool(clauses)
    if len(clauses) != 1:
        return
    i = clauses[0]
    j = i - 1  # the table reference before MATCH_RECOGNIZE reaches back to FROM, JOIN or a comma
    while j >= 0 and tokens[j].token_type not in (TokenType.FROM, TokenType.JOIN, TokenType.COMMA,
                                                   TokenType.L_PAREN, TokenType.R_PAREN):
        j -= 1
    if j >= 0 and tokens[j].token_type == TokenType.FROM and j + 1 < i:
        text = sql[tokens[j + 1].start:tokens[i - 1].end + 1].strip()
        if _RELATION.fullmatch(text):
            model.pattern_source = _normalise(text)


_SASE_FROM = re.compile(r"\bFROM\s+([A-Za-z_][\w$]*(?:\s*\.\s*[A-Za-z_][\w$]*)*)", re.I)


def _strip_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'", " ", sql, flags=re.S)


def compile_text(project: Project, keys: list[str]) -> str:
    """The SQL each selected model runs, in dependency order, with a comment header per model."""
    blocks = []
    for i, key in enumerate(keys, 1):
        m = project.models[key]
        where = (f"{project.target / (m.name + '.parquet')}" if m.materialized == "parquet" else m.relation)
        head = [f"-- [{i}/{len(keys)}] {m.name} ({m.rel}): {m.kind}, materialized {m.materialized} as {where}"]
        if m.tags:
            head.append(f"-- tags: {', '.join(m.tags)}")
        if m.refs:
            head.append(f"-- depends on: {', '.join(project.models[k].name for k in project.parents(key))}")
        body = m.sql.strip("\n").rstrip()
        blocks.append("\n".join(head) + "\n" + body + ";")
    return "\n\n".join(blocks) + ("\n" if blocks else "")
