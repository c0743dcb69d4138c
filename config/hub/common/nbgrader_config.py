"""nbgrader for everyone of the class on the hub (the instructor: with ~/course/nbgrader_config.py): the exchange and
the course id, from the spawner's environment, and the exchange's holes between students closed
(autograder/hub/exchange.py)."""
import os

c = get_config()  # noqa: F821
c.Exchange.root = os.environ["LLM_COURSE_EXCHANGE"]
c.CourseDirectory.course_id = os.environ["LLM_COURSE_ID"]
c.ExchangeFactory.release_assignment = "autograder.hub.exchange.StickyReleaseAssignment"
c.ExchangeFactory.submit = "autograder.hub.exchange.PrivateSubmit"
c.ExchangeFactory.collect = "autograder.hub.exchange.OwnerCheckedCollect"
