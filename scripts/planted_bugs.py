"""Plant each of a list of small deliberate bugs in the core library, one at a time, run the tests
meant to catch it, and put the file back. Every bug must make its tests fail (KILLED); a SURVIVED
line names a test that is missing or too weak.

    .venv/bin/python scripts/planted_bugs.py [NAME-SUBSTRING ...]

The file is restored in a `finally`, Ctrl-C included; the script ends by printing `git status` of
the planted files so that a leftover would show. Exit status 1 when any bug survived.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (name, file, the code as it is, the bug, the tests that must catch it)
BUGS = [
    ("atomic write: straight into the target", "hotsplit_cli/core/jsonio.py",
     "        fd, tmp = _create_temp(path.parent, path.name)\n    except OSError as exc:\n"
     "        raise InputFileError(f\"cannot write {path} ({exc.strerror})\"",
     "        fd, tmp = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666), path\n"
     "    except OSError as exc:\n        raise InputFileError(f\"cannot write {path} ({exc.strerror})\"",
     "tests/planning/test_jsonio.py"),
    ("atomic write: temp file left behind on failure", "hotsplit_cli/core/jsonio.py",
     "            os.unlink(tmp)\n        except FileNotFoundError:",
     "            pass\n        except FileNotFoundError:",
     "tests/planning/test_jsonio.py"),
    ("certificate: a skipped exact solver says certified", "hotsplit_cli/hotset/planner.py",
     'chosen, method, certified = greedy, "greedy", False',
     'chosen, method, certified = greedy, "greedy", True',
     "tests/planning/test_certificate.py"),
    ("histogram: save does not check windows", "hotsplit_cli/traffic/hist.py",
     "        validate_windows(windows, hist.counts_LE.shape, str(path))\n", "        pass\n",
     "tests/planning/test_hist.py"),
    ("histogram: load checks the windows' shapes, not their values", "hotsplit_cli/traffic/hist.py",
     "        validate_windows(mats, counts.shape, where)\n",
     "        validate_windows([np.nan_to_num(np.abs(m)) for m in mats], counts.shape, where)\n",
     "tests/planning/test_hist.py"),
    ("split: ordered by CPU time, not by the time ratio", "hotsplit_cli/hotset/coldpath.py",
     "order = np.lexsort((np.arange(n), penalty))", "order = np.lexsort((np.arange(n), cpu))",
     "tests/planning/test_coldpath_split_rule.py"),
    ("swap rule: evicts the strongest hot experts, not the weakest", "hotsplit_cli/hotset/planner.py",
     "outs = hot_ids[np.lexsort((hot_ids, c[hot_ids]))][:max_swaps]",
     "outs = hot_ids[np.lexsort((hot_ids, -c[hot_ids]))][:max_swaps]",
     "tests/planning/test_planner.py"),
    ("split: the last minimum on ties", "hotsplit_cli/hotset/coldpath.py",
     "k = int(np.argmin(cost))", "k = int(len(cost) - 1 - np.argmin(cost[::-1]))",
     "tests/planning/test_coldpath_split_rule.py"),
]


def main(argv: list[str]) -> int:
    survived = 0
    touched = set()
    for name, rel, old, new, tests in BUGS:
        if argv and not any(a in name for a in argv):
            continue
        path = ROOT / rel
        src = path.read_text()
        if src.count(old) != 1:
            print(f"error: {rel}: the code to plant {name!r} into is not there once; update BUGS", file=sys.stderr)
            return 2
        touched.add(rel)
        path.write_text(src.replace(old, new))
        try:
            r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", tests],
                               cwd=ROOT, capture_output=True, text=True)
        finally:
            path.write_text(src)
        failed = [line.split(" ")[1] for line in r.stdout.splitlines() if line.startswith("FAILED ")]
        if r.returncode == 0:
            survived += 1
        verdict = f"KILLED by {failed[0]}" if failed else ("SURVIVED" if r.returncode == 0 else f"rc {r.returncode}")
        print(f"{name}: {verdict}", flush=True)
    status = subprocess.run(["git", "status", "--short", *sorted(touched)], cwd=ROOT, capture_output=True, text=True)
    print("planted files restored" if not status.stdout else f"planted files differ from git:\n{status.stdout}")
    return 1 if survived else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
