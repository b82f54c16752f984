#!/usr/bin/env perl
# slurm.pl: run a command, or an array of JOB=1:N commands, on Slurm (sbatch) and wait for it.
#
#   slurm.pl [--config conf/slurm.conf] [--mem M] [--num-threads N] [--gpu N] [--time T]
#            [--max-jobs-run N] [JOB=1:N] LOG CMD...
#   slurm.pl [options] --num-nodes K LOG CMD...     (one job of K tasks, CMD once per task)
#
# The same interface and guarantees as utils/run.pl and utils/queue.pl: JOB substituted in
# LOG and CMD, every task's output in its log, exit status non-zero naming the failed logs.
# One array job (sbatch --array=1-N%M) is submitted; the options are translated through the
# config file (default conf/slurm.conf, else a built-in one: --mem -> --mem, --num-threads ->
# --cpus-per-task, --gpu -> --gres=gpu:N, --time -> --time, --num-nodes K -> --nodes=K
# --ntasks-per-node=1).  With --num-nodes, CMD runs on every task under
# `srun --kill-on-bad-exit=1`: one task failing ends the job, whose exit status is then
# non-zero and whose log (all tasks' output) is named; scripts/spk/train.sh uses it to start
# one torchrun per node.
#
# The implementation is shared with queue.pl (Grid Engine), so the two schedulers behave
# alike; see utils/queue.pl for the details and for what it does beyond Kaldi's slurm.pl.
use strict;
use warnings;
use File::Basename qw(dirname);

my $impl = dirname(__FILE__) . "/queue.pl";
-r $impl or die "slurm.pl: cannot find $impl (slurm.pl needs queue.pl beside it)\n";
exec($^X, $impl, "--backend=slurm", @ARGV) or die "slurm.pl: cannot run $impl: $!\n";
