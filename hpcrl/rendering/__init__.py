"""Rendering (pure): a plan in, the job script's text out (the Jinja2 templates in templates/).

Kept empty of imports so a command loads only the modules it uses.
"""
