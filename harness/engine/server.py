"""`python -m harness.engine`: parse the flags, bind, build the model, serve until SIGTERM/SIGINT.

The HTTP server binds before the model is built, so `/health_generate` answers 503 while starting,
as SGLang's does; "The server is fired up and ready to roll!" is logged once it answers 200.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from aiohttp import web

from harness.engine import http_api, openai_api
from harness.engine.args import ServerArgs, parse_args
from harness.engine.logs import setup_logging
from harness.engine.service import EngineService

log = logging.getLogger("harness.engine")
MAX_BODY_BYTES = 64 * 2**20


def build_app(service: EngineService) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[http_api.quiet_when_client_gone])
    app[http_api.SERVICE] = service
    http_api.add_routes(app)
    openai_api.add_routes(app)
    return app


# How the drafts are proposed, in SGLang 0.5.23's words (srt/speculative/dflash_worker_v2.py,
# dspark_components/dspark_draft_sampler.py), so that one log check reads both servers' logs.
# The embedded server has no CUDA graph: "folded into the draft cuda graph" only echoes SGLang's line.
DFLASH_SELECTOR_LINE = "DFLASH selector decode folded into the draft cuda graph (sampling_enabled=%s)."
DFLASH_GREEDY_LINE = "DFLASH draft greedy head folded into the draft cuda graph (tp=%d)."
DSPARK_PROPOSAL_LINE = "DSpark draft proposal (%s) folded into the draft cuda graph%s."
DFLASH_NO_EFFECT_LINE = (
    "--speculative-use-block-verification has no effect for this DFLASH draft: it proposes greedy tokens, and "
    "block verification only differs from token-wise verification for sampled proposals."
)
# SGLang 0.5.23 logs no such warning for DSPARK; the embedded server says it in the same form.
DSPARK_NO_EFFECT_LINE = DFLASH_NO_EFFECT_LINE.replace("DFLASH", "DSPARK")


def draft_lines(args: ServerArgs) -> list[tuple[int, str]]:
    """(level, message) of the start-up lines about the drafts and block verification."""
    lines = []
    if args.speculative_algorithm == "DFLASH":
        lines.append((logging.INFO, DFLASH_SELECTOR_LINE % True if args.sampling_enabled else DFLASH_GREEDY_LINE % 1))
    elif args.speculative_algorithm == "DSPARK":
        lines.append(
            (logging.INFO, DSPARK_PROPOSAL_LINE % ("sampling" if args.sampling_enabled else "greedy draft", ""))
        )
    if args.block_verification and not args.sampling_enabled:  # (without an algorithm: refused, harness.engine.args)
        no_effect = DFLASH_NO_EFFECT_LINE if args.speculative_algorithm == "DFLASH" else DSPARK_NO_EFFECT_LINE
        lines.append((logging.WARNING, no_effect))
    return lines


def log_start(args: ServerArgs) -> None:
    log.info(f"Resolved config: {args.describe()}")
    for level, line in draft_lines(args):
        log.log(level, line)


async def serve(args: ServerArgs) -> int:
    service = EngineService(args)
    runner = web.AppRunner(build_app(service), access_log=None, handle_signals=False)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
    except OSError as e:
        log.error(f"cannot listen on {args.host}:{args.port}: {e}")
        await runner.cleanup()
        return 1
    port = runner.addresses[0][1] if runner.addresses else args.port  # the bound one (--port 0: the system's pick)
    log.info(f"Listening on http://{args.host}:{port}")
    starter = asyncio.create_task(service.start())
    waiter = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({starter, waiter}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if starter in done and starter.exception() is not None:
        log.error(f"start-up failed: {starter.exception()!r}")
        code = 1
    elif starter in done:
        await waiter
    log.info("Shutting down")
    starter.cancel()
    await service.stop()
    await runner.cleanup()
    return code


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.log_level)
    log_start(args)
    return asyncio.run(serve(args))


def cli() -> None:
    """The `specbench-server` command (the same as `python -m harness.engine`)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
