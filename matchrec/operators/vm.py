"""The compiled matcher: the reference Pike VM, run by numba over whole partitions.

It executes the same program (operators.program) with the same thread priority and the
same pruning as operators.matcher, so it returns the same matches. What a DEFINE needs is
prepared beforehand, outside Python's per-row loop:

* ``masks[row]``: bit ``l`` set when every history-independent part of label ``l``'s
  condition holds at ``row`` (computed by DuckDB for the whole input);
* registers: a thread remembers, for a few variable sets, the last row it labelled with one
  of them; a condition part ``current.x OP LAST(V).y`` is then a comparison of two prepared
  numeric columns at the current row and at the register's row.

Two threads are equivalent when they sit at the same instruction with the same registers
(every other part of every condition is independent of the match history).

One call processes partitions from ``part_from`` on and stops early, with a status asking
for larger buffers, when its output or work arrays would overflow; the caller grows them and
calls again from the first unfinished partition. All matching state is per partition, so
partitions can also be split between threads (the function releases the GIL).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from matchrec.operators.program import DONE, END, JUMP, MATCH, SAVE, SPLIT, START  # the opcode table

EV_MATCH, EV_EMPTY, EV_UNMATCHED = 0, 1, 2
OK, NEED_EVENTS, NEED_LABELS, NEED_ARENA, NEED_VISITS, ERR_SKIP_ABSENT, ERR_SKIP_FIRST, ERR_THREADS, \
    ERR_MATCHES, NEED_THREADS, ERR_STEPS, ERR_STOPPED = range(12)
ERR_RANGE = 12  # an exact (integer, DECIMAL) running sum or arithmetic result left the range where it compares exactly
POLL_STEPS = 4096  # steps between two looks at the budget (a few microseconds of work)
SKIP_PAST_LAST, SKIP_NEXT_ROW, SKIP_TO_FIRST, SKIP_TO_LAST = range(4)
CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE = range(6)


@njit(nogil=True, cache=True, inline="always")
def _compare(op, x, y):
    if op == 0:
        return x == y
    if op == 1:
        return x != y
    if op == 2:
        return x < y
    if op == 3:
        return x <= y
    if op == 4:
        return x > y
    return x >= y


@njit(nogil=True, cache=True)
def _fcompare(op, x, y):
    """_compare for floats in DuckDB's order: NaN equals NaN and is above every other number.

    Not inlined: with it inlined the matcher's hot loop ran ~3x slower even on integer compares."""
    xn = x != x
    yn = y != y
    if xn or yn:
        if xn and yn:
            c = 0
        elif xn:
            c = 1
        else:
            c = -1
        return _compare(op, c, 0)
    return _compare(op, x, y)


P_LEAF, P_CMP, P_ISNULL, P_NOT, P_AND, P_OR, P_ADD, P_SUB, P_MUL, P_DIV, P_NEG = range(11)
# per-thread state beside the LAST registers (rows of ``state``: kind, first word, label mask,
# argument is float (for S_NTH_FIRST, S_LAST_N, S_LABEL: the depth n), argument matrix row, DECIMAL
# scale of the argument):
# * S_FIRST: the first row of a set (one word);
# * a running aggregate (A_COUNT .. A_MAX) kept in three words: count of non-null values,
#   accumulator, compensation of a float sum;
# * S_LABEL: the labels of the thread's last n rows, oldest first (n words; PREV(CLASSIFIER(), k)
#   reads the word n - k);
# * S_NTH_FIRST: FIRST(V.x, n), the (n+1)-th row of a set: the set's row count so far (stopping
#   at n+1, so that threads past it stay equivalent) and the row (two words);
# * S_LAST_N: LAST(V.x, n), the set's last n+1 rows, oldest first (n+1 words).
S_FIRST, A_COUNT, A_SUM, A_AVG, A_MIN, A_MAX, S_LABEL, S_NTH_FIRST, S_LAST_N = range(9)
LEAF_ROW, LEAF_FIRST, LEAF_AGG, LEAF_MATCH_NUMBER, LEAF_LABEL, LEAF_NTH = range(6)
EXACT_INT = 1 << 53  # beyond this an integer sum may compare differently with a float


@njit(nogil=True, cache=True, inline="always")
def _fold(func, is_float, c, acc, comp, vi, vf, fbuf, ibuf, compensated):
    """(count, accumulator, compensation) of a running aggregate after one more non-null value.

    Integers stay exact: count -1 reports a sum that left the exactly comparable range. Float
    sums add left to right as Python's sum does (with Neumaier's compensation where its sum
    has it); NaN is the largest value for min and max, as DuckDB orders floats."""
    if func == A_COUNT:
        return c + 1, acc, comp
    if is_float:
        if c == 0:
            fbuf[0] = vf
            return 1, ibuf[0], 0
        ibuf[0] = acc
        x = fbuf[0]
        ibuf[0] = comp
        k = fbuf[0]
        if func == A_SUM or func == A_AVG:
            t = x + vf
            if compensated:
                if abs(x) >= abs(vf):
                    k += (x - t) + vf
                else:
                    k += (vf - t) + x
            x = t
        elif func == A_MIN:
            if (x != x and vf == vf) or vf < x:
                x = vf
        elif (vf != vf and x == x) or vf > x:
            x = vf
        fbuf[0] = k
        comp = ibuf[0]
        fbuf[0] = x
        return c + 1, ibuf[0], comp
    if c == 0:
        if abs(vi) > EXACT_INT and (func == A_SUM or func == A_AVG):
            return -1, acc, comp
        return 1, vi, 0
    if func == A_SUM or func == A_AVG:
        total = acc + vi
        if abs(total) > EXACT_INT:
            return -1, acc, comp
        return c + 1, total, comp
    if func == A_MIN:
        return c + 1, min(acc, vi), comp
    return c + 1, max(acc, vi), comp


@njit(nogil=True, cache=True, _nrt=False)  # no reference counting of its arrays: see _match
def _advance(label, row, regs, state, ivals, ivalid, fvals, fvalid, fbuf, ibuf, compensated):
    """Update the first rows and running aggregates of a thread taking ``row`` with ``label``;
    False when an integer sum left the exact range."""
    for k in range(state.shape[0]):
        if (state[k, 2] >> label) & 1 == 0:
            continue
        func = state[k, 0]
        w = state[k, 1]
        if func == S_FIRST:
            if regs[w] < 0:
                regs[w] = row
            continue
        if func == S_LABEL or func == S_LAST_N:  # a window of the last rows (labels): shift in
            last = w + state[k, 3] - (1 if func == S_LABEL else 0)
            for j in range(w, last):
                regs[j] = regs[j + 1]
            regs[last] = label if func == S_LABEL else row
            continue
        if func == S_NTH_FIRST:
            c = regs[w]
            if c <= state[k, 3]:
                if c == state[k, 3]:
                    regs[w + 1] = row
                regs[w] = c + 1
            continue
        m = state[k, 4]
        is_float = state[k, 3] == 1
        if is_float:
            if not fvalid[m, row]:
                continue
            c, acc, comp = _fold(func, True, regs[w], regs[w + 1], regs[w + 2], 0, fvals[m, row], fbuf, ibuf,
                                 compensated)
        else:
            if not ivalid[m, row]:
                continue
            c, acc, comp = _fold(func, False, regs[w], regs[w + 1], regs[w + 2], ivals[m, row], 0.0, fbuf, ibuf,
                                 compensated)
        if c < 0:
            return False
        regs[w] = c
        regs[w + 1] = acc
        regs[w + 2] = comp
    return True


@njit(nogil=True, cache=True, inline="always")
def _agg_value(k, label, row, regs, t, state, ivals, ivalid, fvals, fvalid, fbuf, ibuf, compensated):
    """(is NULL-free, is float, int value, float value) of running aggregate ``state[k]`` for
    thread ``t`` evaluating ``label`` at ``row``: the current row counts when ``label`` is in
    the aggregate's set (RUNNING semantics)."""
    func = state[k, 0]
    w = state[k, 1]
    m = state[k, 4]
    is_float = state[k, 3] == 1
    c = regs[t, w]
    acc = regs[t, w + 1]
    comp = regs[t, w + 2]
    if (state[k, 2] >> label) & 1:
        if is_float:
            if fvalid[m, row]:
                c, acc, comp = _fold(func, True, c, acc, comp, 0, fvals[m, row], fbuf, ibuf, compensated)
        elif ivalid[m, row]:
            c, acc, comp = _fold(func, False, c, acc, comp, ivals[m, row], 0.0, fbuf, ibuf, compensated)
        if c < 0:
            ibuf[1] = 1  # the matcher stops with ERR_RANGE
            return False, False, 0, 0.0
    if func == A_COUNT:
        return True, False, c, 0.0
    if c == 0:
        return False, False, 0, 0.0
    if is_float:
        ibuf[0] = acc
        x = fbuf[0]
        ibuf[0] = comp
        k2 = fbuf[0]
        if compensated and k2 != 0.0 and k2 - k2 == 0.0:
            x += k2
        if func == A_AVG:
            return True, True, 0, x / c
        return True, True, 0, x
    if func == A_AVG:
        # a DECIMAL sum is the scaled integer acc (|acc| <= 2**53, exact as a float): one division
        # rounds it as float(Decimal) does
        scale = state[k, 5]
        if scale > 0:
            return True, True, 0, (float(acc) / 10.0 ** scale) / c
        return True, True, 0, float(acc) / c
    return True, False, acc, 0.0


@njit(nogil=True, cache=True, inline="always")
def _nth_row(state, k, label, row, regs, t):
    """The row FIRST(V.x, n) (S_NTH_FIRST) or LAST(V.x, n) (S_LAST_N) reads for thread ``t``
    evaluating ``label`` at ``row`` (-1: none): the current row counts when ``label`` is in the set."""
    w = state[k, 1]
    n = state[k, 3]
    current = (state[k, 2] >> label) & 1
    if state[k, 0] == S_NTH_FIRST:
        if regs[t, w + 1] >= 0:
            return regs[t, w + 1]
        if current and regs[t, w] == n:
            return row
        return -1
    if current:  # the current row is the newest of the set, the window's newest the one before
        if n == 0:
            return row
        return regs[t, w + 1]
    return regs[t, w]


@njit(nogil=True, cache=True, inline="always")
def _scaled(x, d):
    """``x * 10**d`` and whether it stays within the exactly comparable range."""
    for _ in range(d):
        if x > EXACT_INT // 10 or x < -(EXACT_INT // 10):
            return False, 0
        x *= 10
    return True, x


@njit(nogil=True, cache=True)
def _arith(o, a, b, sint, sval, sfloat, sscale, ibuf):
    """Stack slot ``a`` := slot ``a`` OP slot ``b`` (both non-NULL), as the reference's Python
    operators compute it: integers and DECIMALs (scaled integers) exactly, a float operand makes
    the result a float, division is in floats (x / 0 is +-inf, 0 / 0 NaN). False (and ibuf[1] set)
    when an exact result would leave the range where it compares exactly."""
    if o == P_DIV or sfloat[a] or sfloat[b]:
        x = sval[a] if sfloat[a] else float(sint[a])
        y = sval[b] if sfloat[b] else float(sint[b])
        if o == P_ADD:
            r = x + y
        elif o == P_SUB:
            r = x - y
        elif o == P_MUL:
            r = x * y
        elif y == 0.0:
            if x == 0.0 or x != x:
                r = np.nan
            else:
                r = math.copysign(math.inf, x) * math.copysign(1.0, y)
        else:
            r = x / y
        sval[a] = r
        sfloat[a] = True
        sscale[a] = 0
        return True
    x = sint[a]
    y = sint[b]
    if x > EXACT_INT or x < -EXACT_INT or y > EXACT_INT or y < -EXACT_INT:
        ibuf[1] = 1
        return False
    if o == P_MUL:
        if x != 0 and (y > EXACT_INT // abs(x) or y < -(EXACT_INT // abs(x))):
            ibuf[1] = 1
            return False
        sint[a] = x * y
        sscale[a] = sscale[a] + sscale[b]
        return True
    sa = sscale[a]
    sb = sscale[b]
    if sa < sb:
        ok, x = _scaled(x, sb - sa)
        sa = sb
    elif sb < sa:
        ok, y = _scaled(y, sa - sb)
    else:
        ok = True
    if not ok:
        ibuf[1] = 1
        return False
    r = x + y if o == P_ADD else x - y
    if r > EXACT_INT or r < -EXACT_INT:
        ibuf[1] = 1
        return False
    sint[a] = r
    sscale[a] = sa
    return True


@njit(nogil=True, cache=True, _nrt=False)  # no reference counting of its arrays: see _match
def _programs(label, row, regs, t, ivals, ivalid, fvals, fvalid, inull, inull_ok, fnull, fnull_ok, pstart, pend,
              pcode, pleaf, pfirst, sval, sint, sfloat, sok, sscale, state, fbuf, ibuf, compensated, match_number):
    """Whether every register program of ``label`` yields TRUE at ``row`` for thread ``t``.

    Kept out of line: the common conditions (mask, comparisons) must stay small enough for the
    matcher's hot loop to compile well, and only labels with programs pay for this call.

    Steps pfirst[label] .. pfirst[label + 1], program after program (pcode[k, 0] numbers them).
    The stack holds a value (float or int, as sfloat says; an int is a DECIMAL scaled by
    10**sscale) and sok False for NULL; SQL's three-valued logic throughout. An arithmetic
    result an int64 cannot keep exactly sets ibuf[1] (the matcher then stops with ERR_RANGE).
    """
    k = pfirst[label]
    end = pfirst[label + 1]
    top = 0
    while k < end:
        o = pcode[k, 1]
        if o == P_LEAF:
            leaf = pcode[k, 2]
            is_float, mrow, reg, off = pleaf[leaf, 0], pleaf[leaf, 1], pleaf[leaf, 2], pleaf[leaf, 3]
            source = pleaf[leaf, 4]
            sscale[top] = pleaf[leaf, 6]
            sfloat[top] = is_float == 1
            pos = row
            if source == LEAF_MATCH_NUMBER:  # the number the match gets if it succeeds
                sok[top] = True
                sint[top] = match_number
                top += 1
                reg = -2  # pushed: no row to read
            if state is not None:  # numba compiles this away for plans without per-thread state
                if source == LEAF_LABEL:  # PREV(CLASSIFIER(), n): a label of the thread's last rows, if any
                    sok[top] = regs[t, reg] >= 0
                    sint[top] = regs[t, reg]
                    top += 1
                    reg = -2
                elif source == LEAF_AGG:
                    ok, af, ai, av = _agg_value(pleaf[leaf, 5], label, row, regs, t, state, ivals, ivalid, fvals,
                                                fvalid, fbuf, ibuf, compensated)
                    sok[top] = ok
                    sfloat[top] = af
                    sint[top] = ai
                    sval[top] = av
                    top += 1
                    reg = -2
                elif source == LEAF_NTH:  # FIRST(V.x, n) or LAST(V.x, n): where the window says
                    pos = _nth_row(state, pleaf[leaf, 5], label, row, regs, t)
                    reg = -1
                    if pos >= 0:
                        pos += off
                        if pos < pstart or pos >= pend:
                            pos = -1
                elif reg >= 0:
                    pos = regs[t, reg]
                    if pos < 0 and source == LEAF_FIRST and (state[pleaf[leaf, 5], 2] >> label) & 1:
                        pos = row  # the current row is the first of a set that has no row yet
            elif reg >= 0:
                pos = regs[t, reg]
            if reg >= 0:
                if pos >= 0:
                    pos += off
                    if pos < pstart or pos >= pend:
                        pos = -1
            if reg != -2:  # a value of the input at ``pos`` (-1: the NULL row)
                if is_float == 1:
                    if pos >= 0:
                        sok[top] = fvalid[mrow, pos]
                        sval[top] = fvals[mrow, pos]
                    else:
                        sok[top] = fnull_ok[mrow]
                        sval[top] = fnull[mrow]
                else:
                    if pos >= 0:
                        sok[top] = ivalid[mrow, pos]
                        sint[top] = ivals[mrow, pos]
                    else:
                        sok[top] = inull_ok[mrow]
                        sint[top] = inull[mrow]
                top += 1
        elif o == P_CMP:
            top -= 1
            a, b = top - 1, top
            if sok[a] and sok[b]:
                if sfloat[a] or sfloat[b]:
                    x = sval[a] if sfloat[a] else float(sint[a])
                    y = sval[b] if sfloat[b] else float(sint[b])
                    r = _fcompare(pcode[k, 2], x, y)
                elif sscale[a] == sscale[b]:
                    r = _compare(pcode[k, 2], sint[a], sint[b])
                else:  # DECIMALs of different scales (or with an integer): compare at the larger scale
                    x = sint[a]
                    y = sint[b]
                    if sscale[a] < sscale[b]:
                        ok, x = _scaled(x, sscale[b] - sscale[a])
                    else:
                        ok, y = _scaled(y, sscale[a] - sscale[b])
                    if not ok:
                        ibuf[1] = 1
                        return False
                    r = _compare(pcode[k, 2], x, y)
                sint[a] = 1 if r else 0
            sfloat[a] = False
            sscale[a] = 0
            sok[a] = sok[a] and sok[b]
        elif o >= P_ADD and o <= P_DIV:
            top -= 1
            a, b = top - 1, top
            if sok[a] and sok[b]:
                if not _arith(o, a, b, sint, sval, sfloat, sscale, ibuf):
                    return False
            else:
                sok[a] = False
                sfloat[a] = sfloat[a] or sfloat[b] or o == P_DIV
        elif o == P_NEG:
            a = top - 1
            if sfloat[a]:
                sval[a] = -sval[a]
            else:
                if sint[a] > EXACT_INT or sint[a] < -EXACT_INT:
                    ibuf[1] = 1
                    return False
                sint[a] = -sint[a]
        elif o == P_ISNULL:
            sint[top - 1] = 0 if sok[top - 1] else 1
            sok[top - 1] = True
            sfloat[top - 1] = False
        elif o == P_NOT:
            sint[top - 1] = 1 - sint[top - 1]
        else:  # AND / OR: a FALSE (TRUE) operand decides, else NULL wins
            top -= 1
            a, b = top - 1, top
            decisive = 0 if o == P_AND else 1
            if (sok[a] and sint[a] == decisive) or (sok[b] and sint[b] == decisive):
                sint[a] = decisive
                sok[a] = True
            elif sok[a] and sok[b]:
                sint[a] = 1 - decisive
            else:
                sok[a] = False
        k += 1
        if k == end or pcode[k, 0] != pcode[k - 1, 0]:  # a program ends: it must yield TRUE
            if not (top == 1 and sok[0] and sint[0] == 1):
                return False
            top = 0
    return True


@njit(nogil=True, cache=True, inline="always")
def _condition(label, row, regs, t, masks, conds, ivals, ivalid, fvals, fvalid, inull, inull_ok, fnull,
               fnull_ok, pstart, pend, pcode, pleaf, pfirst, sval, sint, sfloat, sok, sscale, state, fbuf, ibuf,
               compensated, match_number):
    """Whether ``label`` may be given to ``row`` by thread ``t`` (registers ``regs[t]``).

    ``conds`` and ``pcode`` are None when the pattern has no register comparisons or programs:
    numba then compiles those branches away, and the checks that remain live out of line. The
    matcher's hot loop is sensitive to the size of what is inlined here (measured on V-shape:
    ~50 ns/row with the branches pruned, ~300-400 ns/row with either inlined). Register
    comparisons are all between integers (the engine passes floats as order keys), and their loop
    is written here rather than in a helper: as an inlined helper it ran 4x slower on crimes-like.
    """
    if (masks[row] >> label) & 1 == 0:
        return False
    if conds is not None:
        for k in range(conds.shape[0]):
            if conds[k, 0] != label:
                continue
            reg, op, lhs, rhs, off = conds[k, 1], conds[k, 2], conds[k, 4], conds[k, 5], conds[k, 6]
            pos = regs[t, reg]
            if pos >= 0 and off != 0:
                pos += off
                if pos < pstart or pos >= pend:
                    pos = -1
            if not ivalid[lhs, row]:
                return False
            if pos >= 0:
                if not ivalid[rhs, pos]:
                    return False
                yi = ivals[rhs, pos]
            else:
                if not inull_ok[rhs]:
                    return False
                yi = inull[rhs]
            if not _compare(op, ivals[lhs, row], yi):
                return False
    if pcode is not None:
        if pfirst[label] < pfirst[label + 1] and not _programs(
                label, row, regs, t, ivals, ivalid, fvals, fvalid, inull, inull_ok, fnull, fnull_ok, pstart,
                pend, pcode, pleaf, pfirst, sval, sint, sfloat, sok, sscale, state, fbuf, ibuf, compensated,
                match_number):
            return False
    return True


@njit(nogil=True, cache=True)
def run_partitions(op, ia, ib, keyed, n_regs, reg_sets, reg_init, state, compensated, masks, bounds, part_from,
                   conds, ivals, ivalid, fvals, fvalid, inull, inull_ok, fnull, fnull_ok, pcode, pleaf, pfirst,
                   has_within, within_float, wkey_i, wend_i, wkey_f, wend_f, wvalid, wend_valid, within_desc,
                   skip_kind, skip_mask, empty_mode, probe, max_threads, max_matches, first_mask,
                   ev_kind, ev_start, ev_len, ev_mn, ev_lab, ev_exc, labels_out, exc_out, possible,
                   arena_label, arena_prev, arena_pos, vis_next, vis_regs,
                   cur_pc, cur_node, cur_regs, nxt_pc, nxt_node, nxt_regs, stop, spent, worker, step_limit):
    """Match partitions ``part_from`` .. of the rows ``bounds[p]:bounds[p+1]``.

    The budget (matchrec.budget): every thread taking a row is a step, added to ``spent[worker]``
    every POLL_STEPS steps; when the steps of all workers pass ``step_limit`` the call returns
    ERR_STEPS, and when ``stop[0]`` is set (interrupt, memory) ERR_STOPPED. A numba loop cannot
    see Python's signals, so this is how Ctrl-C reaches it.

    Registers: ``n_regs`` words per thread, ``reg_init`` their values at a match's start; a word
    whose ``reg_sets`` bits hold the taken row's label becomes that row (LAST registers); the
    first rows and running aggregates of ``state`` (None: none) follow (see _advance). A thread's
    words decide its future with the row mask, so threads with equal words are equivalent.

    ``first_mask``: labels the program can consume first (0 when a match may be empty); a row
    whose mask has none of them starts no match.

    Returns (status, partitions done, events, label slots, exclusion slots, detail). Events are
    (kind, start row, match length, match number, first label slot, first exclusion slot) in
    output order; ``empty_mode`` 2 (WITH UNMATCHED ROWS) also reports unmatched rows. With
    ``probe`` set, every row is tried as a start, nothing is emitted, and ``possible[row]``
    tells whether some match (possibly empty) starts there.
    """
    # the scratch of the matcher, allocated here: _match runs without reference counting
    n_prog = op.shape[0]
    depth = 1
    if pcode is not None:
        depth = max(pcode.shape[0], 1)  # a program never stacks more values than it has steps
    sval = np.empty(depth, np.float64)
    sint = np.empty(depth, np.int64)
    sfloat = np.empty(depth, np.bool_)
    sok = np.empty(depth, np.bool_)
    sscale = np.zeros(depth, np.int64)
    # every instruction is visited at most once per closure and pushes at most two entries
    stack_pc = np.empty(4 * n_prog + 4, np.int32)
    stack_node = np.empty(4 * n_prog + 4, np.int64)
    vis_stamp = np.zeros(n_prog, np.int64)
    vis_head = np.full(n_prog, -1, np.int64)
    tmp_regs = np.empty(max(n_regs, 1), np.int64)
    fbuf = np.zeros(2, np.float64)
    return _match(op, ia, ib, keyed, n_regs, reg_sets, reg_init, state, compensated, masks, bounds, part_from,
                  conds, ivals, ivalid, fvals, fvalid, inull, inull_ok, fnull, fnull_ok, pcode, pleaf, pfirst,
                  has_within, within_float, wkey_i, wend_i, wkey_f, wend_f, wvalid, wend_valid, within_desc,
                  skip_kind, skip_mask, empty_mode, probe, max_threads, max_matches, first_mask, ev_kind, ev_start,
                  ev_len, ev_mn, ev_lab, ev_exc, labels_out, exc_out, possible, arena_label, arena_prev, arena_pos,
                  vis_next, vis_regs, cur_pc, cur_node, cur_regs, nxt_pc, nxt_node, nxt_regs, stop, spent, worker,
                  step_limit, sval, sint, sfloat, sok, sscale, stack_pc, stack_node, vis_stamp, vis_head, tmp_regs,
                  fbuf)


@njit(nogil=True, cache=True, _nrt=False)
def _match(op, ia, ib, keyed, n_regs, reg_sets, reg_init, state, compensated, masks, bounds, part_from, conds,
          ivals, ivalid, fvals, fvalid, inull, inull_ok, fnull, fnull_ok, pcode, pleaf, pfirst, has_within,
          within_float, wkey_i, wend_i, wkey_f, wend_f, wvalid, wend_valid, within_desc, skip_kind, skip_mask,
          empty_mode, probe, max_threads, max_matches, first_mask, ev_kind, ev_start, ev_len, ev_mn, ev_lab, ev_exc,
          labels_out, exc_out, possible, arena_label, arena_prev, arena_pos, vis_next, vis_regs, cur_pc, cur_node,
          cur_regs, nxt_pc, nxt_node, nxt_regs, stop, spent, worker, step_limit, sval, sint, sfloat, sok, sscale,
          stack_pc, stack_node, vis_stamp, vis_head, tmp_regs, fbuf):
    """run_partitions with its scratch arrays given.

    Compiled without NRT reference counting (``_nrt=False``; it allocates nothing): with it, every
    call of the out-of-line _programs and _advance increfs and decrefs each array argument (twenty
    atomic pairs per row and thread), which took ~400 ns per row of a running-sum DEFINE against
    ~100 ns for the rest of the step. The arrays are the caller's, alive for the whole call.
    """
    n_ev = 0
    n_lab = 0
    n_exc = 0
    thread_cap = min(max_threads, cur_pc.shape[0])
    stamp = 0
    arena_cap = arena_label.shape[0]
    vis_cap = vis_next.shape[0]
    lab_cap = labels_out.shape[0]
    ev_cap = ev_kind.shape[0]
    exc_cap = exc_out.shape[0]
    n_parts = bounds.shape[0] - 1
    ibuf = fbuf.view(np.int64)  # the bits of a float accumulator kept in an int64 word
    unspent = 0  # steps not yet added to spent[worker]
    for part in range(part_from, n_parts):
        pstart = bounds[part]
        pend = bounds[part + 1]
        ev0, lab0, exc0 = n_ev, n_lab, n_exc
        pos = pstart
        match_number = 1
        last_matched = pstart - 1
        matches_here = 0
        while pos < pend:
            if first_mask != 0 and (masks[pos] & first_mask) == 0:
                # no label the program can consume first holds here: no match starts at this row
                if probe:
                    possible[pos] = 0
                elif empty_mode == 2 and pos > last_matched:
                    if n_ev >= ev_cap:
                        return NEED_EVENTS, part, ev0, lab0, exc0, 0
                    ev_kind[n_ev] = EV_UNMATCHED
                    ev_start[n_ev] = pos
                    ev_len[n_ev] = 0
                    ev_mn[n_ev] = 0
                    ev_lab[n_ev] = n_lab
                    ev_exc[n_ev] = n_exc
                    n_ev += 1
                pos += 1
                continue
            # ---------------- one start position: run the threads
            # Step 0 closes the program from pc 0 at row ``pos``; every later step lets each
            # thread consume row ``idx`` and closes it from the next instruction at ``idx + 1``.
            n_arena = 0
            n_vis = 0
            n_cur = 0
            result = -2  # -2: no match; otherwise the arena node of the match (-1: empty)
            idx = pos
            first = True
            while first or n_cur > 0:
                stamp += 1
                n_nxt = 0
                n_vis = 0  # entries of earlier rows are unreachable (vis_head is reset per stamp)
                n_src = 1 if first else n_cur
                unspent += n_src
                if unspent >= POLL_STEPS:
                    spent[worker] += unspent
                    unspent = 0
                    if stop[0] != 0:
                        return ERR_STOPPED, part, ev0, lab0, exc0, 0
                    if spent.sum() > step_limit:
                        return ERR_STEPS, part, ev0, lab0, exc0, 0
                for i in range(n_src):
                    if first:
                        src_pc = 0
                        node = -1
                        at = pos
                        for r in range(n_regs):
                            tmp_regs[r] = reg_init[r]
                    else:
                        pc = cur_pc[i]
                        if op[pc] == DONE:
                            result = cur_node[i]
                            break  # lower-priority threads die
                        if idx >= pend:
                            continue
                        label = ia[pc]
                        if has_within:
                            if not wvalid[idx] or not wend_valid[pos]:
                                continue
                            if within_float:
                                if within_desc:
                                    if wkey_f[idx] < wend_f[pos]:
                                        continue
                                elif wkey_f[idx] > wend_f[pos]:
                                    continue
                            else:
                                if within_desc:
                                    if wkey_i[idx] < wend_i[pos]:
                                        continue
                                elif wkey_i[idx] > wend_i[pos]:
                                    continue
                        if not _condition(label, idx, cur_regs, i, masks, conds, ivals, ivalid, fvals, fvalid,
                                          inull, inull_ok, fnull, fnull_ok, pstart, pend, pcode, pleaf,
                                          pfirst, sval, sint, sfloat, sok, sscale, state, fbuf, ibuf,
                                          compensated, match_number):
                            if pcode is not None and ibuf[1] != 0:  # an exact value left its range
                                return ERR_RANGE, part, ev0, lab0, exc0, 0
                            continue
                        if n_arena >= arena_cap:
                            return NEED_ARENA, part, ev0, lab0, exc0, 0
                        arena_label[n_arena] = label
                        arena_prev[n_arena] = cur_node[i]
                        arena_pos[n_arena] = idx
                        node = n_arena
                        n_arena += 1
                        for r in range(n_regs):
                            tmp_regs[r] = cur_regs[i, r]
                            if (reg_sets[r] >> label) & 1:
                                tmp_regs[r] = idx
                        if state is not None:
                            if not _advance(label, idx, tmp_regs, state, ivals, ivalid, fvals, fvalid, fbuf, ibuf,
                                            compensated):
                                return ERR_RANGE, part, ev0, lab0, exc0, 0
                        src_pc = pc + 1
                        at = idx + 1
                    # ---- closure: non-consuming instructions from src_pc, in priority order
                    stack_pc[0] = src_pc
                    stack_node[0] = node
                    top = 1
                    while top > 0:
                        top -= 1
                        c_pc = stack_pc[top]
                        c_node = stack_node[top]
                        # equivalent threads: same instruction at this row (and same registers)
                        if vis_stamp[c_pc] != stamp:
                            vis_stamp[c_pc] = stamp
                            vis_head[c_pc] = -1
                        if not keyed[c_pc]:
                            if vis_head[c_pc] == -2:
                                continue
                            vis_head[c_pc] = -2
                        else:
                            k = vis_head[c_pc]
                            seen = False
                            while k >= 0:
                                same = True
                                for r in range(n_regs):
                                    if vis_regs[k, r] != tmp_regs[r]:
                                        same = False
                                        break
                                if same:
                                    seen = True
                                    break
                                k = vis_next[k]
                            if seen:
                                continue
                            if n_vis >= vis_cap:
                                return NEED_VISITS, part, ev0, lab0, exc0, 0
                            for r in range(n_regs):
                                vis_regs[n_vis, r] = tmp_regs[r]
                            vis_next[n_vis] = vis_head[c_pc]
                            vis_head[c_pc] = n_vis
                            n_vis += 1
                        o = op[c_pc]
                        if o == MATCH or o == DONE:
                            if n_nxt >= thread_cap:
                                if thread_cap >= max_threads:
                                    return ERR_THREADS, part, ev0, lab0, exc0, 0
                                return NEED_THREADS, part, ev0, lab0, exc0, 0
                            nxt_pc[n_nxt] = c_pc
                            nxt_node[n_nxt] = c_node
                            for r in range(n_regs):
                                nxt_regs[n_nxt, r] = tmp_regs[r]
                            n_nxt += 1
                        elif o == SPLIT:
                            stack_pc[top] = ib[c_pc]
                            stack_node[top] = c_node
                            stack_pc[top + 1] = ia[c_pc]
                            stack_node[top + 1] = c_node
                            top += 2
                        elif o == JUMP:
                            stack_pc[top] = ia[c_pc]
                            stack_node[top] = c_node
                            top += 1
                        elif o == SAVE:
                            if n_arena >= arena_cap:
                                return NEED_ARENA, part, ev0, lab0, exc0, 0
                            arena_label[n_arena] = -1
                            arena_prev[n_arena] = c_node
                            arena_pos[n_arena] = at
                            stack_pc[top] = c_pc + 1
                            stack_node[top] = n_arena
                            n_arena += 1
                            top += 1
                        elif o == START:
                            if at == pstart:
                                stack_pc[top] = c_pc + 1
                                stack_node[top] = c_node
                                top += 1
                        elif o == END:
                            if at == pend:
                                stack_pc[top] = c_pc + 1
                                stack_node[top] = c_node
                                top += 1
                for i in range(n_nxt):
                    cur_pc[i] = nxt_pc[i]
                    cur_node[i] = nxt_node[i]
                    for r in range(n_regs):
                        cur_regs[i, r] = nxt_regs[i, r]
                n_cur = n_nxt
                if not first:
                    idx += 1
                first = False
            # ---------------- outcome at ``pos``
            if probe:
                possible[pos] = 1 if result != -2 else 0
                pos += 1
                continue
            if result == -2:
                if empty_mode == 2 and pos > last_matched:
                    if n_ev >= ev_cap:
                        return NEED_EVENTS, part, ev0, lab0, exc0, 0
                    ev_kind[n_ev] = EV_UNMATCHED
                    ev_start[n_ev] = pos
                    ev_len[n_ev] = 0
                    ev_mn[n_ev] = 0
                    ev_lab[n_ev] = n_lab
                    ev_exc[n_ev] = n_exc
                    n_ev += 1
                pos += 1
                continue
            matches_here += 1
            if matches_here > max_matches:
                return ERR_MATCHES, part, ev0, lab0, exc0, 0
            # collect labels (and exclusion boundaries) walking back from the result node
            length = 0
            saves = 0
            node = result
            while node >= 0:
                if arena_label[node] >= 0:
                    length += 1
                else:
                    saves += 1
                node = arena_prev[node]
            if n_ev >= ev_cap:
                return NEED_EVENTS, part, ev0, lab0, exc0, 0
            if n_lab + length > lab_cap:
                return NEED_LABELS, part, ev0, lab0, exc0, length
            if n_exc + saves > exc_cap:
                return NEED_LABELS, part, ev0, lab0, exc0, saves
            node = result
            k = length - 1
            s = saves - 1
            while node >= 0:
                if arena_label[node] >= 0:
                    labels_out[n_lab + k] = arena_label[node]
                    k -= 1
                else:
                    exc_out[n_exc + s] = arena_pos[node] - pos
                    s -= 1
                node = arena_prev[node]
            ev_kind[n_ev] = EV_MATCH if length > 0 else EV_EMPTY
            ev_start[n_ev] = pos
            ev_len[n_ev] = length
            ev_mn[n_ev] = match_number
            ev_lab[n_ev] = n_lab
            ev_exc[n_ev] = n_exc
            n_ev += 1
            n_lab += length
            n_exc += saves
            match_number += 1
            if length == 0:
                pos += 1
                continue
            end = pos + length - 1
            if end > last_matched:
                last_matched = end
            if skip_kind == SKIP_PAST_LAST:
                pos = end + 1
            elif skip_kind == SKIP_NEXT_ROW:
                pos += 1
            else:
                target = -1
                base = n_lab - length
                for j in range(length):
                    if (skip_mask >> labels_out[base + j]) & 1:
                        target = j
                        if skip_kind == SKIP_TO_FIRST:
                            break
                if target < 0:
                    return ERR_SKIP_ABSENT, part, n_ev, n_lab, n_exc, 0
                if target == 0:
                    return ERR_SKIP_FIRST, part, n_ev, n_lab, n_exc, 0
                pos += target
    return OK, n_parts, n_ev, n_lab, n_exc, 0
