"""lia-serve: the continuous batcher for asyncio code (engine.py: AsyncEngine, the seam an ASGI app or an actor
framework such as Ray Serve uses), the OpenAI-compatible HTTP API (app.py, FastAPI), its Prometheus metrics
(metrics.py) and the command line (cli.py). app.py, metrics.py and cli.py's server need the optional extra 'serve'
(pip install 'liac[serve]'); engine.py needs nothing beyond liac's own dependencies."""

from liac.runtime.serve.engine import AsyncEngine, Chunk, GenerateRequest, RequestStream

__all__ = ["AsyncEngine", "Chunk", "GenerateRequest", "RequestStream"]
