"""Check every vllm serve command line of the given plan.json files with vLLM's own parser.

Run with the interpreter of .venv-vllm (tools/vllm_argcheck.sh): builds `vllm serve`'s parser exactly as
the `vllm` CLI does, parses each host's argv (Ascend-plugin values swapped for core ones, see
vllm_cli.PLUGIN_VALUES), and runs vLLM's own post-parse validation. Exit 1 naming the host on any refusal.
"""
import contextlib
import io
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "collections"))
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from ansible_collections.npuops.ascend.plugins.module_utils import vllm_cli  # noqa: E402
from vllm import __version__ as vllm_version  # noqa: E402
from vllm.entrypoints.cli.serve import ServeSubcommand  # noqa: E402
from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402


def parser():
    top = FlexibleArgumentParser(prog="vllm")
    sub = top.add_subparsers(required=True, dest="subparser")
    ServeSubcommand().subparser_init(sub)
    return top


def main(paths):
    want = vllm_cli.CHECKED_AGAINST.split()[1]
    if vllm_version != want:
        sys.exit("vllm_cli.CHECKED_AGAINST says vLLM %s but this is vLLM %s" % (want, vllm_version))
    p = parser()
    bad = 0
    checked = 0
    for path in paths:
        with open(path) as f:
            plan = json.load(f)
        for host, entry in sorted(plan["hosts"].items()):
            argv = vllm_cli.core_argv(entry["container"]["argv"])
            assert argv[:2] == ["vllm", "serve"], argv[:2]
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err):
                    args = p.parse_args(argv[1:])
                validate_parsed_serve_args(args)
                checked += 1
            except SystemExit:
                bad += 1
                print("REFUSED %s %s: %s" % (path, host, err.getvalue().strip().splitlines()[-1:]))
            except Exception as e:  # vLLM's validation raises ValueError/TypeError
                bad += 1
                print("REFUSED %s %s: %s: %s" % (path, host, type(e).__name__, e))
    print("vllm %s accepted %d of %d command lines" % (vllm_version, checked, checked + bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
