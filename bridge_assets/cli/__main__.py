"""`python -m bridge_assets.cli`: the `bridge` command, as the console script runs it."""

from bridge_assets.cli.main import app

if __name__ == "__main__":
    app()
