"""Reference answers of the notebooks' exercises, one module per notebook (``nb01.py``, ``nb02.py``, ...).

A notebook's exercise cell imports its reference from here and hands it to :func:`tqlab.lab.exercises.check`,
so the answer is not printed in the lecture; each notebook also shows it in a collapsed ``<details>`` cell.
"""
