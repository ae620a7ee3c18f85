"""Peak resident memory of this process and its live descendants, from /proc.

VmHWM is the high-water mark of the current program image only. The parent's wait4()
ru_maxrss would also count the parent's own peak: Linux carries the pre-exec address
space's high-water mark over into the child's maxrss, and the benchmark parent may have
held a large dataset when it forked.
"""
import os


def _hwm_kb(pid) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(root: int) -> set:
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    family, changed = {root}, True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in family and pid not in family:
                family.add(pid)
                changed = True
    return family - {root}


def peak_rss_kb() -> int:
    """This process's peak RSS plus that of descendants still alive (e.g. a JVM), in kB."""
    me = os.getpid()
    return _hwm_kb(me) + sum(_hwm_kb(pid) for pid in _descendants(me))
