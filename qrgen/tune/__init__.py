"""Schedule search with optuna (qrgen tune): the fastest schedule of a shape whose results pass the gates with
margin. space.py is what a trial samples and the schedule it stands for; evaluate.py measures a schedule (the GPU,
or without one the cost model and the NumPy reference); study.py keeps the optuna study; search.py runs the loop,
the final comparison and writes the file; costmodel.py ranks schedules without a GPU."""
