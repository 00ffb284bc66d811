"""The aml-ray service: FastAPI app (``app.create_app``) served by Ray Serve (``deployment``).

Layout: ``settings`` (environment), ``deps`` (session, caller's key, admin), ``routes/<resource>.py``,
``schemas`` (bodies), ``errors`` (``{"detail": {"reason": ...}}``), ``worker`` (jobs through
:func:`aml_ray.run.evaluation.evaluate`), ``gate`` (publication gate), ``templates`` (public pages).
"""
