#!/usr/bin/env perl
# run.pl: run a command (or an array of JOB=1:N commands) on this machine, each job's
# standard output and error going to its own log file.
#
#   run.pl [options] [JOB=1:N] LOG CMD...
#   run.pl --max-jobs-run 4 JOB=1:16 exp/log/fbank.JOB.log make-feats --split JOB
#
# What it guarantees (the Kaldi/ESPnet run.pl contract, which recipes rely on):
#   * JOB (any identifier given as NAME=a:b) is replaced by the job index in LOG and CMD.
#   * CMD is joined into one bash command line the way Kaldi's runners do: an argument
#     without white space is taken as is (so a quoted '|' or '>' works as a pipe or
#     redirection); one with white space is quoted ("..." or, when it holds a double
#     quote, '...'), so 'ark:gunzip -c foo.gz|' reaches the program as one argument.
#   * Each log starts with "# CMD" and "# Started at DATE" and ends with
#     "# Accounting: time=SECONDS threads=N" and "# Ended (code X) at DATE, elapsed time..".
#   * Exit status 0 only when every job exited 0; otherwise 1 and a message naming the
#     failed jobs' logs ("run.pl: 2 / 4 failed, log is in exp/log/x.*.log", then each log).
#   * --max-jobs-run N bounds the number of jobs running at once (default: the number of
#     CPUs, raised to the number of jobs when that is less than 1.4 times the CPUs).
#   * Scheduler options (--mem, --time, --config, -q, -l ...) are accepted and ignored, so
#     one $train_cmd works with run.pl, queue.pl and slurm.pl; --num-threads is recorded
#     in the accounting line.  --num-nodes 1 is accepted; --num-nodes K > 1 is an error
#     (this machine is one node: multi-node jobs need slurm.pl).
#
# What it does beyond Kaldi's egs/wsj/s5/utils/parallel/run.pl (the anchor):
#   * the failure message lists every failed log with its exit code and shows the last
#     lines of the first one, instead of only a glob;
#   * --gpu N hands each running job its own N devices through CUDA_VISIBLE_DEVICES (taken
#     from CUDA_VISIBLE_DEVICES or nvidia-smi -L), instead of only limiting concurrency;
#   * jobs get /dev/null as standard input, and SIGINT/SIGTERM/SIGHUP sent to run.pl are
#     forwarded to every running job, whose log then says how it ended;
#   * an argument holding both quote characters is quoted correctly.
use strict;
use warnings;
use POSIX qw(:sys_wait_h strftime);
use File::Basename qw(dirname);
use File::Path qw(make_path);

my $me = "run.pl";

sub usage {
    print STDERR <<"EOF";
usage: $me [options] [JOB=1:N] LOG CMD...
  e.g. $me JOB=1:4 exp/log/x.JOB.log echo JOB \\| tr 1 one
  options: --max-jobs-run N  (also -tc N) run at most N jobs at once
           --num-threads N   recorded in the log's accounting line
           --gpu N           give each job N GPUs (CUDA_VISIBLE_DEVICES); 0: none
           --num-nodes 1     accepted (K > 1 is an error: use slurm.pl)
           --mem M, --time T, --config F, and other queue options are ignored
EOF
    exit 1;
}

usage() if @ARGV < 2;

my ($jobname, $jobstart, $jobend) = (undef, 1, 1);
my $max_jobs_run = 0;   # 0: not given
my $num_threads = 1;
my $gpu = 0;

# Options may come before and after JOB=a:b (Kaldi allows both).
for my $pass (1 .. 2) {
    while (@ARGV >= 2 && $ARGV[0] =~ m/^-/) {
        my $switch = shift @ARGV;
        next if $switch eq "-V";
        usage() unless @ARGV;
        my $arg = shift @ARGV;
        if ($switch eq "--max-jobs-run" || $switch eq "-tc") {
            die "$me: invalid $switch '$arg' (want a positive integer)\n" unless $arg =~ m/^\d+$/ && $arg > 0;
            # given more than once, the smallest wins
            $max_jobs_run = $arg if $max_jobs_run == 0 || $arg < $max_jobs_run;
        } elsif ($switch eq "--num-threads") {
            die "$me: invalid --num-threads '$arg'\n" unless $arg =~ m/^\d+$/ && $arg > 0;
            $num_threads = $arg;
        } elsif ($switch eq "--gpu") {
            die "$me: invalid --gpu '$arg'\n" unless $arg =~ m/^\d+$/;
            $gpu = $arg;
        } elsif ($switch eq "--num-nodes") {
            die "$me: invalid --num-nodes '$arg'\n" unless $arg =~ m/^\d+$/ && $arg > 0;
            die "$me: --num-nodes $arg: run.pl runs jobs on this machine only; a job spanning $arg nodes "
              . "needs a scheduler (utils/slurm.pl, cmd_backend=slurm in cmd.sh)\n" if $arg > 1;
        } elsif ($switch eq "-pe") {   # -pe smp N (Grid Engine form of --num-threads)
            usage() unless @ARGV;
            $num_threads = shift @ARGV;
        } else {
            print STDERR "$me: WARNING: suspicious argument '$arg' to $switch; starts with '-'\n"
                if $arg =~ m/^--/;
            # --mem, --time, --config, -q, -l, -sync ...: meaningful to a scheduler only.
        }
    }
    last unless @ARGV;
    if ($ARGV[0] =~ m/^([A-Za-z_]\w*)=(\d+):(\d+)$/) {
        ($jobname, $jobstart, $jobend) = ($1, $2, $3);
        die "$me: invalid job range $ARGV[0] (start > end)\n" if $jobstart > $jobend;
        die "$me: invalid job range $ARGV[0], the first job must be >= 1\n" if $jobstart < 1;
        shift @ARGV;
    } elsif ($ARGV[0] =~ m/^([A-Za-z_]\w*)=(\d+)$/) {
        ($jobname, $jobstart, $jobend) = ($1, $2, $2);
        die "$me: invalid job index $ARGV[0], must be >= 1\n" if $jobstart < 1;
        shift @ARGV;
    } elsif ($ARGV[0] =~ m/^[^=\s]+=.*:/) {
        print STDERR "$me: WARNING: suspicious first argument '$ARGV[0]' (want NAME=a:b)\n";
    }
}
usage() if @ARGV < 2;

my $logfile = shift @ARGV;
if (defined $jobname && $jobend > $jobstart && index($logfile, $jobname) < 0) {
    die "$me: you are trying to run a parallel job but are putting the output into "
      . "one log file ($logfile); put $jobname in its name\n";
}

# Kaldi's quoting of the command's words (see the header).
sub quote_word {
    my ($w) = @_;
    return $w if $w =~ m/^\S+$/;
    return "\"$w\"" if $w !~ m/"/;
    return "'$w'" if $w !~ m/'/;
    (my $q = $w) =~ s/'/'\\''/g;   # holds both quote characters
    return "'$q'";
}
my $cmd = join(" ", map { quote_word($_) } @ARGV);

sub for_job {
    my ($text, $id) = @_;
    $text =~ s/\Q$jobname\E/$id/g if defined $jobname;
    return $text;
}

# GPU slots: with --gpu N each running job owns N of the visible devices.
my @gpu_slots;   # each: comma-separated device list
if ($gpu > 0) {
    my @devices;
    if (defined $ENV{CUDA_VISIBLE_DEVICES} && $ENV{CUDA_VISIBLE_DEVICES} =~ m/\S/) {
        @devices = grep { $_ ne "" } split(/,/, $ENV{CUDA_VISIBLE_DEVICES});
    } elsif (open(my $smi, "-|", "nvidia-smi -L 2>/dev/null")) {
        while (<$smi>) { push @devices, $1 if m/^GPU (\d+):/; }
        close($smi);
    }
    if (@devices >= $gpu) {
        for (my $i = 0; $i + $gpu <= @devices; $i += $gpu) {
            push @gpu_slots, join(",", @devices[$i .. $i + $gpu - 1]);
        }
    } else {
        print STDERR "$me: WARNING: --gpu $gpu but "
          . scalar(@devices) . " GPU(s) visible; jobs run one at a time without a device assignment\n";
    }
}

my $num_jobs = $jobend - $jobstart + 1;
if ($max_jobs_run == 0) {
    if ($gpu > 0) {
        $max_jobs_run = @gpu_slots ? scalar(@gpu_slots) : 1;
    } else {
        my $ncpu = 0;
        if (open(my $ci, "<", "/proc/cpuinfo")) {
            while (<$ci>) { $ncpu++ if m/^processor\s*:/; }
            close($ci);
        }
        if ($ncpu == 0) {
            my $n = `getconf _NPROCESSORS_ONLN 2>/dev/null`;
            $ncpu = ($n && $n =~ m/^(\d+)/) ? $1 : 8;
        }
        $max_jobs_run = $ncpu;
        # a few jobs over the CPU count: run them all rather than leave a short tail
        $max_jobs_run = $num_jobs if $num_jobs > $ncpu && $num_jobs < 1.4 * $ncpu;
    }
}

sub now { return strftime("%a %b %e %H:%M:%S %Z %Y", localtime); }

# Run one job in this (forked) process and return its exit status for the log.
# Runs in its own process group, so a signal forwarded by the parent reaches the whole job.
sub run_job {
    my ($id, $devices) = @_;
    my $log = for_job($logfile, $id);
    my $jcmd = for_job($cmd, $id);
    my $dir = dirname($log);
    eval { make_path($dir) } unless -d $dir;
    open(my $fh, ">", $log) or do { print STDERR "$me: cannot write log file $log: $!\n"; return 1; };
    (my $shown = $jcmd) =~ s/\n/\n# /g;
    print $fh "# $shown\n";
    print $fh "# Started at " . now() . "\n";
    print $fh "# CUDA_VISIBLE_DEVICES=$devices\n" if defined $devices;
    print $fh "#\n";
    close($fh);
    my $start = time();
    my $pid = fork();
    if (!defined $pid) { print STDERR "$me: fork failed: $!\n"; return 1; }
    if ($pid == 0) {
        $SIG{$_} = 'DEFAULT' for qw(INT TERM HUP);
        $ENV{CUDA_VISIBLE_DEVICES} = $devices if defined $devices;
        open(STDIN, "<", "/dev/null");
        open(STDOUT, ">>", $log) or die "$me: cannot append to $log: $!\n";
        open(STDERR, ">&", \*STDOUT);
        # the newline keeps a trailing comment in CMD from swallowing the parenthesis
        exec("bash", "-c", "( $jcmd\n)") or die "$me: cannot run bash: $!\n";
    }
    waitpid($pid, 0);
    my $status = $?;
    my $elapsed = time() - $start;
    my $code = $status >> 8;
    my $sig = $status & 127;
    my $how = $sig ? "code $code; signal $sig" : "code $code";
    if (open(my $fa, ">>", $log)) {
        print $fa "# Accounting: time=$elapsed threads=$num_threads\n";
        print $fa "# Ended ($how) at " . now() . ", elapsed time $elapsed seconds\n";
        close($fa);
    }
    return $sig ? 128 + $sig : $code;
}

my %running;      # pid -> job id
my %slot_of;      # pid -> gpu slot index
my @slot_busy = (0) x scalar(@gpu_slots);
my %code_of;      # job id -> exit code
my $caught;       # the signal that interrupted us

sub forward_signal {
    my ($sig) = @_;
    $caught //= $sig;
    kill($sig, -$_) for keys %running;   # each job leads its own process group
}
$SIG{$_} = \&forward_signal for qw(INT TERM HUP);

sub reap_one {
    my $pid;
    do { $pid = waitpid(-1, 0); } while ($pid == -1 && $!{EINTR});
    return 0 if $pid <= 0;
    my $status = $?;
    return 1 unless exists $running{$pid};
    my $id = delete $running{$pid};
    $code_of{$id} = ($status >> 8) || ($status & 127 ? 128 + ($status & 127) : 0);
    $slot_busy[delete $slot_of{$pid}]-- if exists $slot_of{$pid};
    return 1;
}

for my $id ($jobstart .. $jobend) {
    last if defined $caught;
    while (keys(%running) >= $max_jobs_run) { reap_one() or last; }
    last if defined $caught;
    my ($slot, $devices);
    if (@gpu_slots) {   # the least used slot (an explicit --max-jobs-run may share devices)
        $slot = 0;
        for my $s (1 .. $#gpu_slots) { $slot = $s if $slot_busy[$s] < $slot_busy[$slot]; }
        $devices = $gpu_slots[$slot];
        $slot_busy[$slot]++;
    }
    my $pid = fork();
    die "$me: fork failed: $!\n" unless defined $pid;
    if ($pid == 0) {
        # the wrapper outlives a forwarded signal so that it can finish the log
        $SIG{$_} = 'IGNORE' for qw(INT TERM HUP);
        setpgrp(0, 0);
        POSIX::_exit(run_job($id, $devices) & 255);
    }
    setpgrp($pid, $pid);   # also here, so a signal forwarded right away finds the group
    $running{$pid} = $id;
    $slot_of{$pid} = $slot if defined $slot;
}
while (keys %running) { reap_one() or last; }

if (defined $caught) {
    my $started = scalar(keys %code_of);
    print STDERR "$me: interrupted by SIG$caught after starting $started of $num_jobs jobs; logs are in "
      . (defined $jobname ? for_job($logfile, "*") : $logfile) . "\n";
    exit($caught eq "INT" ? 130 : $caught eq "HUP" ? 129 : 143);
}

my @failed = grep { $code_of{$_} != 0 } sort { $a <=> $b } keys %code_of;
exit 0 unless @failed;

if ($num_jobs == 1) {
    my $log = for_job($logfile, $jobstart);
    print STDERR "$me: job failed with code $code_of{$failed[0]}, log is in $log\n";
    print STDERR "$me: probably you forgot to put JOB=1:\$nj in your script\n"
        if !defined $jobname && $log =~ m/JOB/;
} else {
    print STDERR "$me: " . scalar(@failed) . " / $num_jobs failed, log is in " . for_job($logfile, "*") . "\n";
    my $n = 0;
    for my $id (@failed) {
        if (++$n > 20) { print STDERR "$me:   ... and " . (@failed - 20) . " more\n"; last; }
        print STDERR "$me:   failed (code $code_of{$id}): " . for_job($logfile, $id) . "\n";
    }
}
# The last lines the first failed job wrote, so the cause is on the screen.
my $first = for_job($logfile, $failed[0]);
if (open(my $fh, "<", $first)) {
    my @lines = <$fh>;
    close($fh);
    # drop the header (up to the lone "#") and the accounting/ended footer
    my ($i) = grep { $lines[$_] eq "#\n" } 0 .. $#lines;
    my @body = @lines[(defined $i ? $i + 1 : 0) .. $#lines];
    pop @body while @body && $body[-1] =~ m/^# (Accounting|Ended)/;
    if (@body) {
        my @tail = @body > 5 ? @body[-5 .. -1] : @body;
        print STDERR "$me: last lines of $first:\n";
        print STDERR "  | $_" for @tail;
        print STDERR "\n" unless $tail[-1] =~ m/\n$/;
    }
}
exit 1;
