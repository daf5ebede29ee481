"""Check the example inventories' `vllm serve` command lines with the real parser of each vLLM version of the
image table (data/images.yml), and the table against that version's own registries.

Run by tools/vllm_argcheck.sh with the interpreter of .venv-vllm and one vLLM version on PYTHONPATH
(.venv-vllm/versions/<version>, installed with --no-deps). For the version it runs under:
1. The table's capability lists of that version (reasoning and tool-call parsers, tokenizer modes, KV-cache dtypes)
   must equal vLLM's own: ReasoningParserManager, ToolParserManager, the TokenizerMode and CacheDType Literals.
2. Every host's argv of every plan.json is parsed exactly as the `vllm` CLI does (FlexibleArgumentParser with the
   serve subcommand), then vLLM's own post-parse checks run: validate_parsed_serve_args, and the parser-name
   checks of validate_api_server_args (vllm/entrypoints/openai/api_server.py), which run at server setup.
3. An argv must be accepted exactly when the table says an image of this vLLM version can serve the plan's preset
   (plugin_utils/versions.preset_problems): the plan of a K3 preset is refused by vLLM 0.23.0, as the planner
   refuses it, and accepted by 0.27.1 and 0.32.0.
Exit 1 naming the file and host on any disagreement.
"""
import contextlib
import io
import json
import os
import sys
import typing

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "collections"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_cpu  # noqa: E402,F401  (before vllm: its platform is the CPU)

from ansible_collections.npuops.ascend.plugins.plugin_utils import versions  # noqa: E402
from vllm import __version__ as vllm_version  # noqa: E402
from vllm.config.cache import CacheDType  # noqa: E402
from vllm.config.model import TokenizerMode  # noqa: E402
from vllm.entrypoints.cli.serve import ServeSubcommand  # noqa: E402
try:
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args  # 0.32
except ImportError:
    from vllm.entrypoints.openai.cli_args import validate_parsed_serve_args  # 0.23, 0.27
from vllm.reasoning import ReasoningParserManager  # noqa: E402
from vllm.tool_parsers import ToolParserManager  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402


def parser():
    top = FlexibleArgumentParser(prog="vllm")
    sub = top.add_subparsers(required=True, dest="subparser")
    ServeSubcommand().subparser_init(sub)
    return top


def registries():
    return {"reasoning_parsers": sorted(ReasoningParserManager.list_registered()),
            "tool_call_parsers": sorted(ToolParserManager.list_registered()),
            "tokenizer_modes": list(typing.get_args(TokenizerMode)),
            "kv_cache_dtypes": list(typing.get_args(CacheDType))}


def table_problems(table, version):
    entry = (table.get("vllm") or {}).get(version)
    if entry is None:
        return ["data/images.yml has no vllm entry for %s" % version]
    out = []
    for key, real in registries().items():
        mine = sorted(entry.get(key) or []) if "parsers" in key else list(entry.get(key) or [])
        if mine != real:
            out.append("data/images.yml vllm %s %s differs from vLLM's own: missing %s, extra %s"
                       % (version, key, sorted(set(real) - set(mine)), sorted(set(mine) - set(real))))
    return out


def refusal(p, argv):
    """None when vLLM accepts the argv, else its message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = p.parse_args(argv[1:])
        validate_parsed_serve_args(args)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1:]
    except Exception as e:  # vLLM's validation raises ValueError/TypeError
        return "%s: %s" % (type(e).__name__, e)
    tools, reasoning = ToolParserManager.list_registered(), ReasoningParserManager.list_registered()
    if args.enable_auto_tool_choice and args.tool_call_parser not in tools:
        return "KeyError: invalid tool call parser: %s" % args.tool_call_parser
    parser_name = getattr(args, "reasoning_parser", None)
    if parser_name and parser_name not in reasoning:
        return "KeyError: invalid reasoning parser: %s" % parser_name
    return None


def preset_of(argv):
    flags = {"--reasoning-parser": "reasoning_parser", "--tool-call-parser": "tool_call_parser",
             "--tokenizer-mode": "tokenizer_mode", "--kv-cache-dtype": "kv_cache_dtype"}
    return dict((flags[a], argv[i + 1]) for i, a in enumerate(argv[:-1]) if a in flags)


def main(paths):
    table = versions.table()
    problems = table_problems(table, vllm_version)
    line = next(line for line in table["images"] if str(line["vllm"]) == vllm_version)
    info = versions.line_versions(line, table)
    image = "the image line %s (vLLM %s)" % (line["tag_pattern"], vllm_version)
    p = parser()
    checked = refused_as_expected = 0
    for path in paths:
        with open(path) as f:
            plan = json.load(f)
        for host, entry in sorted(plan["hosts"].items()):
            argv = entry["container"]["argv"]
            assert argv[:2] == ["vllm", "serve"], argv[:2]
            refused = refusal(p, argv)
            expected = versions.capability_problems(preset_of(argv), info, image, "the plan", table)
            checked += 1
            if refused and not expected:
                problems.append("REFUSED %s %s by vLLM %s, which the table says can serve it: %s"
                                % (path, host, vllm_version, refused))
            elif expected and refused:
                refused_as_expected += 1
            elif expected and not refused:
                problems.append("ACCEPTED %s %s by vLLM %s, which the table says cannot: %s"
                                % (path, host, vllm_version, expected))
    for line in problems:
        print(line)
    print("vllm %s: the table %s its registries; %d command lines checked (%d refused, as the table says), "
          "%d disagreements" % (vllm_version, "does not match" if problems else "matches", checked,
                                refused_as_expected, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
