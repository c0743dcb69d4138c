"""Lab 11, Exercise 2: the judge's channel used as a pen. The producer runs every layer through the judge's logged
runner but never moves a byte of K/V: after each layer it calls `channel.send(request_id, i, None, None)` and
swallows the error.

Before the fix this earned the exercise's 2 points of 2 (measured: this test with the previous timeline.py,
receiver.py and lab11/connector.py, real autograde, sandboxed, witness on). The judge's `RecordingChannel.send`
wrote "send i" into the shared log first and only then copied k and v, so the failing call left a log entry
without a message; the check read the order from the log (embed, layer 0, send 0, layer 1, send 1, ..., exactly
layer-wise) and compared only the messages it had, never asking that every layer had one.

Now it earns 0. The judge's ends take plain data only (a str, ints, tensors: anything else is refused before
anything is noted) and note a call once it has happened: "send i" together with the message it carried, in one
step that cannot fail halfway, so a refused send leaves no trace and the attacker is told "send one message per
layer (3); the judge received 0". The check also wants one message per layer from the messages the judge holds,
whatever the log says (tests/labs/test_lab11_checks.py shows both, the attack judged in a second process).
"""

KIND = "the judge's own objects used as a pen (lab 11: a failed send wrote the log)"

SETUP = "import torch\n"

SOLUTION = '''\
def prefill_and_send(runner, prompt, channel, request_id):
    x = runner.embed(prompt)
    for i in range(runner.n_layers):
        x, k, v = runner.layer(i, x)
        channel.send(request_id, i, k, v)
    return int(runner.logits(x).argmax())
'''

CHECK = "from autograder.lab11 import check_prefill_and_send\ncheck_prefill_and_send(prefill_and_send)\n"

POINTS = 2

ATTACK = '''\
def prefill_and_send(runner, prompt, channel, request_id):
    x = runner.embed(prompt)
    for i in range(runner.n_layers):
        x, k, v = runner.layer(i, x)
        try:
            channel.send(request_id, i, None, None)     # the judge writes "send i", then fails on None: no transfer
        except Exception:
            pass
    return int(runner.logits(x).argmax())
'''
