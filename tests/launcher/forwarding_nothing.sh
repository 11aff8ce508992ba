#!/bin/sh
# A command wrapper of the command-job tests, as users write them: it runs its arguments (the trainer)
# as its child, forwards no signal, and exits with the trainer's code.
"$@"
code=$?
echo "wrapper: the trainer exited $code"
exit $code
