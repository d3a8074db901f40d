"""FreeScale dashboard: a thin Streamlit + Plotly UI over :mod:`fsobs` (see README.md).

``streamlit run dashboard/streamlit_app.py [-- --store DIR]``. Logic lives in plain modules
(``store``, ``upload``, ``tables``, ``balance_plan``, ``tracediff``, ``figures``) that import
without Streamlit; ``cache``, ``widgets`` and ``app_pages/`` are the Streamlit layer.
"""
