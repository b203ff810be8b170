"""The console and the HTTP API: an optional extra (``pip install 'perdure[web]'``).

:func:`perdure.web.app.create_app` returns the ASGI application of one app;
``perdure console`` serves it with uvicorn. Nothing in the engine imports
this package.
"""
