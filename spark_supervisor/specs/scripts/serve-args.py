# The serve's arguments through the image's own vLLM argument parser, the one `vllm serve` and the OpenAI
# API server build (make_arg_parser), without starting anything: a flag this vLLM does not know, or a value
# it refuses, is found now instead of minutes into a load. Prints one line: "serve_args=ok", "serve_args=
# refused <argparse's message>" or "serve_args=unchecked <why>" (no vLLM parser found: that proves nothing).
import sys

try:
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
except Exception as e:  # noqa: BLE001 (any failure to build the parser means: not checked)
    print(f"serve_args=unchecked {type(e).__name__}: {e}"[:300].replace("\n", " "))
    sys.exit(0)


def refused(message):
    print(f"serve_args=refused {message}"[:500].replace("\n", " "))
    sys.exit(0)


parser.error = refused
try:
    parser.parse_args(sys.argv[1:])
except SystemExit:
    raise
except Exception as e:  # noqa: BLE001 (a parser that raises instead of erroring: refused, with its words)
    refused(f"{type(e).__name__}: {e}")
print("serve_args=ok")
