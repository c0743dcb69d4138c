"""Mutation testing of the course's checks (`make mutation LAB=NN`): each exercise's solution code is mutated
(mutmut's operators, plus the course's own) and graded by the lab's check cells; a mutant the checks pass is a wrong
implementation they cannot see. A floor above the labs: it imports nothing of grading, judging or the GPU tier."""
