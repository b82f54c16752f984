#!/usr/bin/env perl
# queue.pl: run a command, or an array of JOB=1:N commands, on a batch scheduler and wait for
# it: Sun/Son of Grid Engine through qsub (this name), Slurm through sbatch (utils/slurm.pl,
# which runs this file with --backend=slurm). Same interface as utils/run.pl:
#
#   queue.pl [options] [JOB=1:N] LOG CMD...
#   slurm.pl --config conf/slurm.conf --mem 4G --num-threads 2 JOB=1:8 exp/log/x.JOB.log CMD...
#
# Options (translated through the config file, Kaldi format, see egs/TEMPLATE/spk1/conf/):
#   --config F        (default conf/queue.conf or conf/slurm.conf if readable, else built in)
#   --mem M  --num-threads N  --gpu N  --time T  and any --name value the config describes;
#   --max-jobs-run N  at most N array tasks at once (qsub -tc N, sbatch --array=a-b%N);
#   --num-nodes K     (slurm.pl only, not with JOB=1:N) one job of K tasks, by default one per
#                     node (--nodes=K --ntasks-per-node=1); CMD runs once per task under
#                     `srun --kill-on-bad-exit=1`, so a task that fails ends the others and
#                     the job; every task's output goes to LOG (a launcher such as
#                     scripts/spk/torchrun_node.sh tells the tasks apart by SLURM_PROCID);
#   other -x value pairs (e.g. -q all.q, -p gpu, -l h=node1) go to qsub/sbatch unchanged.
# Config lines: "command qsub ..." (the submit command and its fixed options);
#   "option NAME=* ...$0..." (NAME given: $0 is its value); "option NAME=VALUE ..." (that
#   exact value); "default NAME=VALUE" (used when NAME is not given).
#
# What it guarantees:
#   * JOB is replaced by the task index in LOG and in CMD (CMD words are joined and quoted
#     like run.pl / Kaldi), each task's stdout and stderr go to its log, which has the
#     run.pl header and footer ("# Accounting: time=.. threads=..", "# Ended (code X) at ..").
#   * The submitted script is kept as LOGDIR/q/NAME.sh, with every scheduler option as a
#     "#$" / "#SBATCH" directive, so it can be read, and resubmitted by hand; the
#     scheduler's own output for task T is LOGDIR/q/NAME.T.log.
#   * The job runs in the submitting directory with the submitter's PATH, PYTHONPATH,
#     VIRTUAL_ENV, LC_ALL, ... written into the script, so the recipe's .venv python is the
#     one that runs, whatever the scheduler's environment export policy.
#   * Exit status 0 only when every task exited 0. Otherwise 1, naming every failed log with
#     its code. A task that ends without reporting (cancelled, killed for time or memory,
#     node lost, stuck in an error state) is detected by asking the scheduler, reported with
#     the scheduler's state, and counted as failed: queue.pl never waits forever.
#   * Interrupting queue.pl (SIGINT/SIGTERM/SIGHUP) cancels the job (qdel / scancel).
#
# What it does beyond Kaldi's egs/wsj/s5/utils/parallel/{queue,slurm}.pl (the anchors):
#   * JOB is substituted per task with its literal value, so JOB inside a single-quoted
#     argument is replaced too (Kaldi rewrites it to ${SGE_TASK_ID}, which single quotes
#     leave unexpanded);
#   * a task lost by the scheduler is reported within seconds with the scheduler's reason,
#     and a task stuck in Grid Engine's error state (Eqw), or pending in Slurm for a reason
#     that never clears (PartitionNodeLimit, a per-job QOS limit ...), is reported and deleted;
#   * no fixed 5 s sleep after creating the q/ directory, and polling starts at 50 ms, so a
#     short array job returns as soon as its tasks end;
#   * one implementation for both schedulers, so their behaviour cannot drift apart.
use strict;
use warnings;
use Cwd qw(getcwd);
use File::Basename qw(basename dirname);
use File::Path qw(make_path);
use POSIX qw(strftime);
use Time::HiRes qw(sleep time);

my $backend = "sge";
if (@ARGV && $ARGV[0] =~ m/^--backend=(sge|slurm)$/) { $backend = $1; shift @ARGV; }
my $me = $backend eq "slurm" ? "slurm.pl" : "queue.pl";
my $original_args = join(" ", @ARGV);

# What differs between the two schedulers.
my %B = (
    sge => {
        default_config => <<'EOF',
command qsub -V -cwd -S /bin/bash -j y
option mem=* -l mem_free=$0
option mem=0
option num_threads=* -pe smp $0
option num_threads=1
option time=* -l h_rt=$0
default gpu=0
option gpu=0
option gpu=* -l gpu=$0
EOF
        directive => '#$',
        task_var  => 'SGE_TASK_ID',
        job_id    => '${JOB_ID:-?}',
    },
    slurm => {
        default_config => <<'EOF',
command sbatch --export=ALL
option mem=* --mem=$0
option mem=0
option num_threads=* --cpus-per-task=$0
option num_threads=1
option time=* --time=$0
default gpu=0
option gpu=0
option gpu=* --gres=gpu:$0
option num_nodes=* --nodes=$0 --ntasks-per-node=1
EOF
        directive => '#SBATCH',
        task_var  => 'SLURM_ARRAY_TASK_ID',
        job_id    => '${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-?}}',
    },
);
my $sched = $B{$backend};

sub usage {
    print STDERR <<"EOF";
usage: $me [options] [JOB=1:N] LOG CMD...
  e.g. $me --mem 2G JOB=1:4 exp/log/x.JOB.log echo JOB \\| tr 1 one
  options: --config F (default conf/@{[$backend eq "slurm" ? "slurm" : "queue"]}.conf), --mem M,
           --num-threads N, --gpu N, --time T, --max-jobs-run N, and -x value pairs that are
           passed to the scheduler as they are
EOF
    exit 1;
}
usage() if @ARGV < 2;

# ---------------------------------------------------------------- arguments
my ($jobname, $jobstart, $jobend);
my %cli;             # name (dashes -> underscores) -> value
my @raw_opts;        # scheduler options given directly (-q all.q, -p gpu ...)
my $num_threads = 1;
for my $pass (1 .. 3) {   # options may come before and after JOB=a:b
    while (@ARGV >= 2 && $ARGV[0] =~ m/^-/) {
        my $switch = shift @ARGV;
        if ($switch eq "-V") { push @raw_opts, ["-V"]; next; }
        usage() unless @ARGV;
        my $arg = shift @ARGV;
        print STDERR "$me: WARNING: suspicious argument '$arg' to $switch; starts with '-'\n"
            if $arg =~ m/^--/;
        if ($switch =~ m/^--(.+)$/) {
            (my $name = $1) =~ s/-/_/g;
            $cli{$name} = $arg;
        } elsif ($switch eq "-pe") {          # -pe smp N
            usage() unless @ARGV;
            my $n = shift @ARGV;
            push @raw_opts, [$switch, $arg, $n];
            $num_threads = $n;
        } elsif ($switch eq "-tc") {
            $cli{max_jobs_run} = $arg;
        } elsif ($switch eq "-sync") {
            # we always wait for the job ourselves
        } else {
            push @raw_opts, [$switch, $arg];
        }
    }
    last unless @ARGV;
    if ($ARGV[0] =~ m/^([A-Za-z_]\w*)=(\d+):(\d+)$/) {
        ($jobname, $jobstart, $jobend) = ($1, $2, $3);
        die "$me: invalid job range $ARGV[0] (start > end)\n" if $jobstart > $jobend;
        die "$me: invalid job range $ARGV[0], the first task must be >= 1\n" if $jobstart < 1;
        shift @ARGV;
    } elsif ($ARGV[0] =~ m/^([A-Za-z_]\w*)=(\d+)$/) {
        ($jobname, $jobstart, $jobend) = ($1, $2, $2);
        die "$me: invalid task index $ARGV[0], must be >= 1\n" if $jobstart < 1;
        shift @ARGV;
    } elsif ($ARGV[0] =~ m/^[^=\s]+=.*:/) {
        print STDERR "$me: WARNING: suspicious first argument '$ARGV[0]' (want NAME=a:b)\n";
    }
}
usage() if @ARGV < 2;
my $array = defined $jobname;
($jobstart, $jobend) = (1, 1) unless $array;

my $max_jobs_run;
if (exists $cli{max_jobs_run}) {
    $max_jobs_run = delete $cli{max_jobs_run};
    die "$me: invalid --max-jobs-run '$max_jobs_run' (want a positive integer)\n"
        unless $max_jobs_run =~ m/^\d+$/ && $max_jobs_run > 0;
}
my $num_nodes;
if (exists $cli{num_nodes}) {
    $num_nodes = $cli{num_nodes};
    die "$me: invalid --num-nodes '$num_nodes' (want a positive integer)\n" unless $num_nodes =~ m/^\d+$/ && $num_nodes > 0;
    die "$me: --num-nodes is supported by slurm.pl only (Grid Engine has no portable multi-node launcher)\n"
        if $backend ne "slurm";
    die "$me: --num-nodes cannot be combined with an array job ($jobname=$jobstart:$jobend): "
      . "it runs one command as one job of $num_nodes tasks\n" if $array;
}
if (exists $cli{num_threads}) {
    die "$me: invalid --num-threads '$cli{num_threads}'\n" unless $cli{num_threads} =~ m/^\d+$/ && $cli{num_threads} > 0;
    $num_threads = $cli{num_threads};
}

# ---------------------------------------------------------------- config
my $config = delete $cli{config};
my $config_name;
my @config_lines;
{
    my $default_file = "conf/" . ($backend eq "slurm" ? "slurm" : "queue") . ".conf";
    my $file = $config // (-r $default_file ? $default_file : undef);
    if (defined $file) {
        open(my $fh, "<", $file) or die "$me: cannot read config file $file: $!\n";
        @config_lines = <$fh>;
        close($fh);
        $config_name = $file;
    } else {
        @config_lines = map { "$_\n" } split(/\n/, $sched->{default_config});
        $config_name = "the built-in default config";
    }
}
my (@submit_cmd, %opt_star, %opt_value, %defaults);
{
    my $lineno = 0;
    for my $line (@config_lines) {
        $lineno++;
        (my $l = $line) =~ s/\s*#.*$//s;   # comments
        $l =~ s/^\s+|\s+$//g;
        next if $l eq "";
        if ($l =~ m/^command\s+(.+)$/) {
            @submit_cmd = split(/\s+/, $1);
        } elsif ($l =~ m/^option\s+([^=\s]+)=\*\s+(.+)$/) {
            my ($name, $args) = ($1, $2);
            print STDERR "$me: WARNING: $config_name:$lineno: '$l' has no \$0 to substitute\n"
                unless $args =~ m/\$0/;
            $opt_star{$name} = $args;
        } elsif ($l =~ m/^option\s+([^=\s]+)=(\S+)\s*(.*)$/) {
            $opt_value{"$1=$2"} = $3;
        } elsif ($l =~ m/^default\s+([^=\s]+)=(\S+)\s*$/) {
            $defaults{$1} = $2;
        } else {
            die "$me: $config_name:$lineno: cannot parse line '$l' "
              . "(want 'command ...', 'option NAME=* ...\$0...', 'option NAME=VALUE ...' or 'default NAME=VALUE')\n";
        }
    }
    die "$me: $config_name has no 'command ...' line\n" unless @submit_cmd;
}
for my $name (keys %defaults) { $cli{$name} = $defaults{$name} unless exists $cli{$name}; }

# Scheduler options: the command's own, those the config derives from --name value, raw ones.
my @opt_words = @submit_cmd[1 .. $#submit_cmd];
for my $name (sort keys %cli) {
    my $value = $cli{$name};
    my $args;
    if (exists $opt_value{"$name=$value"}) {
        $args = $opt_value{"$name=$value"};
    } elsif (exists $opt_star{$name}) {
        ($args = $opt_star{$name}) =~ s/\$0/$value/g;
    } else {
        (my $dashed = $name) =~ s/_/-/g;
        die "$me: option --$dashed $value is not described in $config_name "
          . "(add a line 'option $name=* ...' or 'option $name=$value ...')\n";
    }
    push @opt_words, split(/\s+/, $args) if $args =~ m/\S/;
}
push @opt_words, @$_ for @raw_opts;
my $submit_prog = $submit_cmd[0];

# Group words into one option per directive line: a word starting with '-' opens a line.
my @directives;
for my $w (@opt_words) {
    if ($w =~ m/^-/ || !@directives) { push @directives, [$w]; }
    else { push @{ $directives[-1] }, $w; }
}

# ---------------------------------------------------------------- the command
my $cwd = getcwd();
my $logfile = shift @ARGV;
if ($array && $jobend > $jobstart && index($logfile, $jobname) < 0) {
    die "$me: you are trying to run a parallel job but are putting the output into "
      . "one log file ($logfile); put $jobname in its name\n";
}
sub quote_word {
    my ($w) = @_;
    return $w if $w =~ m/^\S+$/;
    return "\"$w\"" if $w !~ m/"/;
    return "'$w'" if $w !~ m/'/;
    (my $q = $w) =~ s/'/'\\''/g;
    return "'$q'";
}
my $cmd = join(" ", map { quote_word($_) } @ARGV);
sub for_task {
    my ($text, $id) = @_;
    $text =~ s/\Q$jobname\E/$id/g if $array;
    return $text;
}
sub squote { my ($s) = @_; $s =~ s/'/'\\''/g; return "'$s'"; }
sub abs_path_of { my ($p) = @_; return $p =~ m{^/} ? $p : "$cwd/$p"; }

# ---------------------------------------------------------------- files
my $logdir = dirname($logfile);
eval { make_path($logdir) } unless -d $logdir;
die "$me: cannot make the log directory $logdir\n" unless -d $logdir;
my $qdir = "$logdir/q";
eval { make_path($qdir) } unless -d $qdir;
die "$me: cannot make the directory $qdir\n" unless -d $qdir;
my $name = basename($logfile);
$name =~ s/\.?\Q$jobname\E//g if $array;
$name =~ s/\.log$//;
$name = "job" if $name eq "";
my $script = abs_path_of("$qdir/$name.sh");
my $qlog_pattern = abs_path_of("$qdir/$name") . ($array ? "." . ($backend eq "slurm" ? '%a' : '$TASK_ID') : "") . ".log";
sub qlog_of { my ($id) = @_; return abs_path_of("$qdir/$name") . ($array ? ".$id" : "") . ".log"; }
my $sync_base = abs_path_of("$qdir/done.$$");
sub sync_of { my ($id) = @_; return "$sync_base.$id"; }
unlink(sync_of($_)) for $jobstart .. $jobend;
unlink(qlog_of($_)) for $jobstart .. $jobend;

(my $job_name = $name) =~ s/[^A-Za-z0-9_.-]/_/g;
$job_name = "j$job_name" if $job_name !~ m/^[A-Za-z]/;

# Environment the job needs whatever the scheduler exports.
my @env_names = qw(PATH LD_LIBRARY_PATH PYTHONPATH VIRTUAL_ENV CONDA_PREFIX LC_ALL LANG
                   PYTHONIOENCODING OMP_NUM_THREADS MKL_NUM_THREADS KALDI_ROOT MAIN_ROOT
                   GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME);

my $now = strftime("%Y-%m-%d %H:%M:%S", localtime);
open(my $q, ">", "$script.tmp") or die "$me: cannot write $script.tmp: $!\n";
print $q "#!/bin/bash\n";
if ($backend eq "slurm") {
    print $q "#SBATCH --job-name=$job_name\n";
    print $q "#SBATCH --chdir=$cwd\n" if $cwd !~ m/\s/;
    print $q "#SBATCH --output=$qlog_pattern\n";
    print $q "#SBATCH --open-mode=append\n";
    print $q "#SBATCH --array=$jobstart-$jobend" . (defined $max_jobs_run ? "%$max_jobs_run" : "") . "\n" if $array;
} else {
    print $q "#\$ -N $job_name\n";
    print $q "#\$ -o $qlog_pattern\n";
    print $q "#\$ -t $jobstart-$jobend\n" if $array;
    print $q "#\$ -tc $max_jobs_run\n" if $array && defined $max_jobs_run;
}
print $q "$sched->{directive} @$_\n" for @directives;
print $q "# Written by $me on $now for:\n#   $me " . ($original_args =~ s/\n/ /gr) . "\n";
print $q "# Submit again by hand with: $submit_prog $script\n";
print $q "cd " . squote($cwd) . " || exit 1\n";
for my $v (@env_names) { print $q "export $v=" . squote($ENV{$v}) . "\n" if defined $ENV{$v}; }
print $q "[ \"\${CUDA_VISIBLE_DEVICES:-}\" = NoDevFiles ] && unset CUDA_VISIBLE_DEVICES\n";
if ($array) { print $q "task=\${$sched->{task_var}}\n"; } else { print $q "task=1\n"; }
print $q "case \"\$task\" in\n";
for my $id ($jobstart .. $jobend) {
    my $tcmd = for_task($cmd, $id);
    (my $shown = $tcmd) =~ s/\n/\n# /g;
    print $q "  $id)\n";
    print $q "    log=" . squote(for_task($logfile, $id)) . "\n";
    print $q "    shown=" . squote($shown) . "\n";
    if (defined $num_nodes) {
        # one copy per task, started by srun; a task exiting non-zero ends the others. srun
        # does not take --cpus-per-task from the job since Slurm 22.05: pass it on, or each
        # task would be bound to one CPU where the site binds tasks to cores.
        print $q "    run_task() { srun --kill-on-bad-exit=1 \${SLURM_CPUS_PER_TASK:+--cpus-per-task=\$SLURM_CPUS_PER_TASK} bash -c "
          . squote("$tcmd\n") . " ; } ;;\n";
    } else {
        print $q "    run_task() { ( $tcmd\n    ) ; } ;;\n";
    }
}
print $q "  *) echo \"$me: task '\$task' is not in this script\" >&2; exit 1 ;;\n";
print $q "esac\n";
print $q "status=" . squote($sync_base) . ".\$task\n";
print $q "mkdir -p \"\$(dirname \"\$log\")\"\n";
print $q "{ printf '# %s\\n' \"\$shown\"\n";
print $q "  echo \"# Running on \$(hostname) as $backend job $sched->{job_id}" . ($array ? ", task \$task" : "")
  . (defined $num_nodes ? ", \${SLURM_NTASKS:-?} tasks on \${SLURM_JOB_NODELIST:-?}" : "") . "\"\n";
print $q "  echo \"# Started at \$(date)\"\n";
print $q "  [ -n \"\${CUDA_VISIBLE_DEVICES:-}\" ] && echo \"# CUDA_VISIBLE_DEVICES=\$CUDA_VISIBLE_DEVICES\"\n";
print $q "  echo '#'\n";
print $q "} > \"\$log\" || exit 1\n";
print $q "start=\$(date +%s)\n";
print $q "run_task < /dev/null >> \"\$log\" 2>&1\n";
print $q "ret=\$?\n";
print $q "end=\$(date +%s)\n";
print $q "{ echo \"# Accounting: time=\$((end - start)) threads=$num_threads\"\n";
print $q "  echo \"# Ended (code \$ret) at \$(date), elapsed time \$((end - start)) seconds\"\n";
print $q "} >> \"\$log\"\n";
print $q "echo \"\$ret\" > \"\$status.tmp\" && mv -f \"\$status.tmp\" \"\$status\"\n";
# 0 or 1 only: Grid Engine treats 99 and 100 specially (reschedule, error state).
print $q "[ \"\$ret\" -eq 0 ]\n";
close($q) or die "$me: cannot write $script (disk full?)\n";
chmod(0755, "$script.tmp");
rename("$script.tmp", $script) or die "$me: cannot rename $script.tmp: $!\n";

# ---------------------------------------------------------------- submit
# From here on a signal is only noted; the wait loop cancels the job and exits.
my $caught;
for my $sig (qw(INT TERM HUP)) {
    $SIG{$sig} = sub { $caught //= $sig; };
}
my @submit = $backend eq "slurm" ? ($submit_prog, "--parsable", $script) : ($submit_prog, "-terse", $script);
my $job_id;
{
    my $out = "";
    for my $try (1 .. 3) {
        my $pid = open(my $fh, "-|");
        die "$me: fork failed: $!\n" unless defined $pid;
        if ($pid == 0) { open(STDERR, ">&", \*STDOUT); exec(@submit) or do { print "cannot run $submit_prog: $!\n"; POSIX::_exit(127); }; }
        $out = do { local $/; <$fh> } // "";
        close($fh);
        my $rc = $? >> 8;
        if ($rc == 0 && $out =~ m/^\s*(\d+)/m) { $job_id = $1; last; }
        chomp $out;
        # Grid Engine's master may be briefly unreachable; anything else will not get better.
        last unless $out =~ m/(gdi request|qmaster|Socket timed out|Unable to contact slurm controller)/i && $try < 3;
        print STDERR "$me: submission failed ($out); retrying in 10 s\n";
        sleep(10);
        last if defined $caught;
    }
    if (!defined $job_id) {
        print STDERR "$me: error submitting the job: @submit\n$me: the scheduler said: $out\n";
        print STDERR "$me: the job script is $script\n";
        exit 1;
    }
}

# ---------------------------------------------------------------- wait
sub cancel_job {
    my @c = $backend eq "slurm" ? ("scancel", $job_id) : ("qdel", $job_id);
    system("@c >/dev/null 2>&1");
}

sub run_capture {   # (exit code, output) of a command, no shell
    my @c = @_;
    my $pid = open(my $fh, "-|");
    return (127, "") unless defined $pid;
    if ($pid == 0) { open(STDERR, ">&", \*STDOUT); exec(@c) or POSIX::_exit(127); }
    my $out = do { local $/; <$fh> } // "";
    close($fh);
    return ($? >> 8, $out);
}

# Slurm pending reasons that no amount of waiting resolves (a per-job request above a limit).
my $slurm_never_runs = qr/^(PartitionNodeLimit|PartitionTimeLimit|BadConstraints|(QOS|Assoc)Max\w*PerJob\w*)$/;

# Returns (gone, {task => "state reason"} for tasks in a state they will not leave by themselves).
sub scheduler_view {
    if ($backend eq "slurm") {
        my ($rc, $out) = run_capture("squeue", "-h", "-j", $job_id, "-o", "%i|%T|%r");
        return (1, {}) if $out =~ m/Invalid job id/i;
        return (0, {}) if $rc != 0;    # the controller did not answer: assume still there
        my @lines = grep { m/\S/ } split(/\n/, $out);
        return (1, {}) unless @lines;
        # A job pending for a reason that does not clear by itself (e.g. more nodes than the
        # partition has: Slurm accepts it unless EnforcePartLimits is set) would wait forever.
        my %stuck;
        for my $line (@lines) {
            my ($id, $state, $reason) = split(/\|/, $line);
            next unless defined $reason && $state eq "PENDING" && $reason =~ m/$slurm_never_runs/;
            my $why = "pending for ever (slurm reason $reason: the job asks for more than the partition or "
              . "its limits allow, e.g. --num-nodes above the partition's nodes)";
            if ($id =~ m/_(\d+)$/) { $stuck{$1} = $why; }
            else { $stuck{$_} = $why for $jobstart .. $jobend; }
        }
        return (0, \%stuck);
    } else {
        my ($rc, $out) = run_capture("qstat", "-j", $job_id);
        return (1, {}) if $rc != 0 && $out =~ m/(do not exist|not exist)/i;
        return (0, {}) if $rc != 0;
        # A task in error state (Eqw) waits for an administrator: qstat -j prints an
        # "error reason T: message" line for it.
        my %stuck;
        while ($out =~ m/^error reason\s+(\d+):\s*(.*?)\s*$/mg) { $stuck{$1} = "error state (Eqw): $2"; }
        return (0, \%stuck);
    }
}

# What the scheduler still knows about a task that ended without status (for the message).
sub task_fate {
    my ($id) = @_;
    if ($backend eq "slurm") {
        my $tid = $array ? "${job_id}_$id" : $job_id;
        my ($rc, $out) = run_capture("scontrol", "show", "job", $tid);
        if ($rc == 0 && $out =~ m/JobState=(\S+)\s+Reason=(\S+)/) {
            return "slurm state $1" . ($2 ne "None" ? ", reason $2" : "");
        }
        return "no longer known to slurm";
    }
    return "no longer known to grid engine";
}

my %code_of;       # task -> exit code (>= 0), or undef while running
my %lost;          # task -> explanation
my @pending = ($jobstart .. $jobend);
my $wait = 0.05;
my $last_check = time();
my $gone_since;
while (@pending) {
    if (defined $caught) {
        cancel_job();
        print STDERR "$me: interrupted by SIG$caught; cancelled $backend job $job_id; logs are in "
          . ($array ? for_task($logfile, "*") : $logfile) . "\n";
        exit($caught eq "INT" ? 130 : $caught eq "HUP" ? 129 : 143);
    }
    my @still;
    for my $id (@pending) {
        my $f = sync_of($id);
        if (-f $f && open(my $fh, "<", $f)) {
            my $c = <$fh>;
            close($fh);
            if (defined $c && $c =~ m/^(\d+)/) { $code_of{$id} = $1; unlink($f); next; }
        }
        push @still, $id;
    }
    @pending = @still;
    last unless @pending;
    sleep($wait);
    $wait = $wait * 1.5 > 1.0 ? 1.0 : $wait * 1.5;
    next if time() - $last_check < 3.0;
    $last_check = time();
    my ($gone, $stuck) = scheduler_view();
    if (%$stuck) {
        for my $id (keys %$stuck) {
            next unless grep { $_ == $id } @pending;
            $lost{$id} = $stuck->{$id};
        }
        if (%lost) {
            print STDERR "$me: task(s) " . join(",", sort { $a <=> $b } keys %lost) . " of job $job_id will not run: "
              . (values %lost)[0] . "; deleting the job\n";
            cancel_job();
            @pending = grep { !exists $lost{$_} } @pending;
            for my $id (@pending) { $lost{$id} = "deleted with the job"; }
            @pending = ();
            last;
        }
    }
    if ($gone) {
        # The job has left the scheduler; give the file system a moment before we conclude.
        $gone_since //= time();
        next if time() - $gone_since < 3.0;
        for my $id (@pending) {
            next if -f sync_of($id);
            $lost{$id} = task_fate($id);
        }
        @pending = grep { !exists $lost{$_} } @pending;
    }
}

# ---------------------------------------------------------------- report
my @failed = grep { exists $lost{$_} || $code_of{$_} != 0 } ($jobstart .. $jobend);
exit 0 unless @failed;
my $num = $jobend - $jobstart + 1;
sub describe {
    my ($id) = @_;
    return "code $code_of{$id}" unless exists $lost{$id};
    return "ended without status: $lost{$id}; scheduler output in " . qlog_of($id);
}
if ($num == 1) {
    my $id = $failed[0];
    print STDERR "$me: job failed (" . describe($id) . "), log is in " . for_task($logfile, $id) . "\n";
} else {
    print STDERR "$me: " . scalar(@failed) . " / $num failed, log is in " . for_task($logfile, "*") . "\n";
    my $n = 0;
    for my $id (@failed) {
        if (++$n > 20) { print STDERR "$me:   ... and " . (@failed - 20) . " more\n"; last; }
        print STDERR "$me:   failed (" . describe($id) . "): " . for_task($logfile, $id) . "\n";
    }
}
my $first = $failed[0];
for my $f (for_task($logfile, $first), (exists $lost{$first} ? qlog_of($first) : ())) {
    next unless open(my $fh, "<", $f);
    my @lines = <$fh>;
    close($fh);
    my ($i) = grep { $lines[$_] eq "#\n" } 0 .. $#lines;
    my @body = @lines[(defined $i ? $i + 1 : 0) .. $#lines];
    pop @body while @body && $body[-1] =~ m/^# (Accounting|Ended)/;
    next unless @body;
    my @tail = @body > 5 ? @body[-5 .. -1] : @body;
    print STDERR "$me: last lines of $f:\n";
    print STDERR "  | $_" for @tail;
    print STDERR "\n" unless $tail[-1] =~ m/\n$/;
}
exit 1;
