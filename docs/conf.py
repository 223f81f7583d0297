"""Sphinx configuration of tqlab's static site (``make site``; tools/build_site.py assembles the sources).

The pages are the notebooks executed by ``make run`` (build/NN_*.ipynb), rendered by MyST-NB
without running them again (``nb_execution_mode = "off"``): figures, tables and the widgets'
saved state as they were when the notebook ran. Widgets render from that saved state with
``@jupyter-widgets/html-manager``'s ``embed.js``, served from ``_static/`` (tools/build_site.py
fetches the pinned, hash-checked copy), so the site works offline.
"""

project = "tqlab"
author = "tqlab contributors"
extensions = ["myst_nb"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
html_theme = "sphinx_book_theme"
html_title = "tqlab: vLLM's locked workspace, lecture by lecture"
html_static_path = ["_static"]
html_theme_options = {"show_toc_level": 2, "use_download_button": True}
nb_execution_mode = "off"  # render what `make run` executed; never execute twice
nb_merge_streams = True
# The widgets' saved state is rendered by the html-manager's standalone bundle (no RequireJS, no CDN).
nb_ipywidgets_js = {"embed.js": {}}
myst_enable_extensions = ["dollarmath", "colon_fence"]
suppress_warnings = ["mystnb.unknown_mime_type", "myst.header"]
