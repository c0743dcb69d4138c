"""`python -m autograder COMMAND`: one module per command, each with `HELP`, `add_arguments(parser)` and
`run(args, course) -> exit status` (heavy imports inside `run`, so that `--help` stays fast). autograder/cli.py
builds the parser from `COMMANDS` and dispatches."""

COMMANDS = {       # command -> module of autograder.commands, in the order `--help` lists them
    "grade": "grade", "autograde": "autograde", "feedback": "feedback", "export": "export",
    "similarity": "similarity", "release": "release", "normalize": "normalize", "doctor": "doctor",
    "calibrate": "calibrate", "gpu-check": "gpu_check", "workspace": "workspace", "progress": "progress",
    "runall": "runall", "exercise-map": "exercise_map", "interview": "interview", "mutation": "mutation",
    "hub": "hub", "grading-bench": "grading_bench", "witness-plans": "witness_plans",
}
