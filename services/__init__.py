"""The six services of TAS-MoE Lab. Each is a package with ``app.create_app(settings)`` and ``cli.register``."""
