"""The jobs a run can be: ``run`` (fit, evaluate, record), ``plan`` (the memory plan only) and
``adaptive`` (sliding-window refits, `tamrun.adaptive.job`); each consumes one `Prepared`."""
