"""Compile a row pattern to a flat program for the reference matcher.

Seven instruction kinds: MATCH (consume one row with a label), SPLIT (two continuations,
the first preferred), JUMP, SAVE (exclusion boundaries), START / END (anchors) and DONE.
Preferment follows SQL:2016 as Trino implements it: greedy quantifiers prefer one more
iteration, reluctant ones one fewer, alternation prefers the left branch, and PERMUTE is
the alternation of all orderings in lexicographic order. Bounded quantifiers are unrolled
(``X{2,4}`` = ``X X (X X?)?``); an unbounded tail becomes a do-while loop over the last copy.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from matchrec.operators import pattern_ir as P

# The opcode table: the compiled matcher (operators.vm) reads the same numbers.
MATCH, SPLIT, JUMP, SAVE, START, END, DONE = range(7)
_NAMES = ["MATCH", "SPLIT", "JUMP", "SAVE", "START", "END", "DONE"]
MAX_PROGRAM = 200_000


class PatternTooLarge(Exception):
    """The unrolled program would exceed MAX_PROGRAM instructions (``span``: the part to blame, if known)."""

    def __init__(self, message: str | None = None, span=None):
        super().__init__(message)
        self.message, self.span = message, span


@dataclass(frozen=True)
class Instruction:
    op: int
    a: int = 0  # MATCH: label id; SPLIT: first target; JUMP: target
    b: int = 0  # SPLIT: second target

    def __str__(self) -> str:
        if self.op == MATCH:
            return f"MATCH {self.a}"
        if self.op == SPLIT:
            return f"SPLIT {self.a}, {self.b}"
        if self.op == JUMP:
            return f"JUMP {self.a}"
        return _NAMES[self.op]


@dataclass(frozen=True)
class Program:
    code: tuple[Instruction, ...]
    labels: tuple[str, ...]  # label id -> variable name
    has_exclusions: bool

    def waits(self, pc: int) -> frozenset[int]:
        """MATCH and DONE instructions a thread at ``pc`` reaches without consuming a row.

        SAVE and anchors are followed as if they always passed (anchors only remove paths), so
        the set is a superset when the pattern has anchors."""
        seen, stack, out = set(), [pc], set()
        while stack:
            p = stack.pop()
            if p in seen:
                continue
            seen.add(p)
            ins = self.code[p]
            if ins.op in (MATCH, DONE):
                out.add(p)
            elif ins.op == SPLIT:
                stack += [ins.a, ins.b]
            elif ins.op == JUMP:
                stack.append(ins.a)
            else:
                stack.append(p + 1)
        return frozenset(out)

    def dump(self) -> str:
        out = []
        for pc, ins in enumerate(self.code):
            text = str(ins)
            if ins.op == MATCH:
                text += f"  ({self.labels[ins.a]})"
            out.append(f"{pc:4d}: {text}")
        return "\n".join(out)

    def reachable_labels(self) -> list[frozenset[int]]:
        """For each pc, the label ids some path from pc can still consume."""
        result = []
        for pc in range(len(self.code)):
            seen, stack, labels = set(), [pc], set()
            while stack:
                p = stack.pop()
                if p in seen:
                    continue
                seen.add(p)
                ins = self.code[p]
                if ins.op == MATCH:
                    labels.add(ins.a)
                    stack.append(p + 1)
                elif ins.op == SPLIT:
                    stack += [ins.a, ins.b]
                elif ins.op == JUMP:
                    stack.append(ins.a)
                elif ins.op != DONE:
                    stack.append(p + 1)
            result.append(frozenset(labels))
        return result


def compile_pattern(pattern: P.Node, labels: list[str]) -> Program:
    """The program of a lowered pattern (``planner.pattern.lower``) over the variables ``labels``."""
    code: list[list] = []
    has_excl = False
    depth = 0  # nesting of exclusions: only the outermost one marks rows

    def emit(op, a=0, b=0) -> int:
        if len(code) >= MAX_PROGRAM:
            raise PatternTooLarge()
        code.append([op, a, b])
        return len(code) - 1

    def gen(node: P.Node) -> None:
        nonlocal has_excl, depth
        if isinstance(node, P.Var):
            emit(MATCH, node.index)
        elif isinstance(node, P.Empty):
            pass
        elif isinstance(node, P.Anchor):
            emit(START if node.start else END)
        elif isinstance(node, P.Concat):
            for item in node.items:
                gen(item)
        elif isinstance(node, P.Alt):
            alternation(list(node.items))
        elif isinstance(node, P.Permute):
            # n! orderings, each with a SPLIT and a JUMP at least: refuse before building any of them
            orderings = math.factorial(len(node.items))
            if len(code) + 2 * orderings > MAX_PROGRAM:
                raise PatternTooLarge(f"PERMUTE of {len(node.items)} variables has {orderings:,} orderings, too many "
                                      f"to match; write fewer variables in PERMUTE", node.span)
            orders = itertools.permutations(range(len(node.items)))
            branches = [P.Concat(node.span, tuple(node.items[i] for i in order)) for order in orders]
            alternation(branches)
        elif isinstance(node, P.Exclude):
            has_excl = True
            if depth == 0:
                emit(SAVE)
            depth += 1
            gen(node.body)
            depth -= 1
            if depth == 0:
                emit(SAVE)
        elif isinstance(node, P.Repeat):
            quantified(node)
        else:  # pragma: no cover
            raise TypeError(node)

    def alternation(items: list) -> None:
        jumps = []
        for k, item in enumerate(items):
            if k == len(items) - 1:
                gen(item)
                break
            split = emit(SPLIT)
            code[split][1] = len(code)
            gen(item)
            jumps.append(emit(JUMP))
            code[split][2] = len(code)
        for j in jumps:
            code[j][1] = len(code)

    def loop(start: int, greedy: bool) -> None:
        split = emit(SPLIT)
        code[split][1], code[split][2] = (start, split + 1) if greedy else (split + 1, start)

    def quantified(node: P.Repeat) -> None:
        if node.max is None:
            # Unbounded, as Trino lays it out: the loop is a do-while whose closing SPLIT jumps
            # back to the start of the last copy of the body, so an iteration that matches no
            # row can still leave the loop (the thread returning to the body start is dropped).
            if node.min == 0:
                entry = emit(SPLIT)
                start = len(code)
                gen(node.body)
                loop(start, node.greedy)
                end = len(code)
                code[entry][1], code[entry][2] = (start, end) if node.greedy else (end, start)
                return
            start = len(code)
            for _ in range(node.min):
                start = len(code)
                gen(node.body)
            loop(start, node.greedy)
            return
        for _ in range(node.min):
            gen(node.body)
        # X{n,m} tail = (X (X (X)?)?)? : every "skip" branch leaves the whole nest.
        splits = []
        for _ in range(node.max - node.min):
            splits.append(emit(SPLIT))
            gen(node.body)
        end = len(code)
        for split in splits:
            code[split][1], code[split][2] = (split + 1, end) if node.greedy else (end, split + 1)

    gen(pattern)
    emit(DONE)
    return Program(code=tuple(Instruction(*c) for c in code), labels=tuple(labels), has_exclusions=has_excl)
