"""A class on JupyterHub, on this machine: system users, nbgrader's exchange, the hub's spawner and its limits.

    python -m autograder hub setup --students 3     # as root: an instructor and 3 students (system users)
    python -m autograder hub start                  # JupyterHub on 127.0.0.1:8000 (config/hub/jupyterhub_config.py)
    python -m autograder hub teardown               # the users, their homes, the exchange: gone

Who does what (nbgrader 0.9.6's exchange; every step is nbgrader's own command or screen):

    instructor (hub admin)             exchange (/srv/llm-course-hub/exchange)      student
    ~/course: a clone of the course    <course>/outbound/<lab>/   <--- fetch ---   JupyterLab's Assignments tab,
      release_assignment  ---------->  <course>/inbound/<student>+<lab>+<time>  <--- submit
      collect <--------------------    (students may write, not list or read)
      make autograde (sandboxed)
      make feedback, release_feedback -> <course>/feedback/<hash>.html ----> fetch_feedback

classroom.py makes and removes the class (users, homes, exchange, the instructor's course copy) and keeps what it
made in one state file; spawner.py is the hub's LocalProcessSpawner with the course's environment per role and
limits per student (memory, processes, file size) set in the child before it runs anything.
"""
