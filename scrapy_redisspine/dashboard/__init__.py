"""The page of ``redisspine dashboard`` (``index.html``: HTML, CSS and JS in one
hand-written file, no build step and nothing fetched from elsewhere)."""
