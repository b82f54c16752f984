#!/usr/bin/env perl
# Splits a table (scp, utt2spk, text, ...) into parts with about equal numbers of lines.
#
# Usage: split_scp.pl [--utt2spk=<utt2spk>] <in.scp> <out1.scp> <out2.scp> ...
#    or: split_scp.pl -j <num-jobs> <job-id> [--one-based] [--utt2spk=<utt2spk>] <in.scp> [<out.scp>]
#
# Without --utt2spk the input is cut into consecutive runs of lines; the first
# (lines mod parts) parts get one line more.  With --utt2spk=FILE the first field
# of each input line is an utterance id, and all lines of one speaker go to the
# same part (speakers in order of first appearance, balanced by utterance count);
# this needs at least as many speakers as parts.  With -j N k only part k
# (0-based, or 1-based with --one-based) is written, to <out.scp> or stdout.
# The parts are the same as Kaldi's split_scp.pl gives.  Each output file appears
# atomically (written to a temporary name, then renamed).  Errors name the file
# and line; an empty part is an error (exit 1) after all parts are written.
use strict;
use warnings;

my $num_jobs = 0;
my $job_id = 0;
my $utt2spk_file = "";
my $one_based = 0;

for (my $x = 1; $x <= 3 && @ARGV > 0; $x++) {
    if ($ARGV[0] eq "-j") {
        shift @ARGV;
        $num_jobs = shift @ARGV;
        $job_id = shift @ARGV;
        (defined $job_id && $num_jobs =~ /^-?\d+$/ && $job_id =~ /^-?\d+$/)
            or die "$0: -j needs two integers: -j <num-jobs> <job-id>\n";
    }
    if (@ARGV > 0 && $ARGV[0] =~ /^--utt2spk=(.+)$/) {
        $utt2spk_file = $1;
        shift @ARGV;
    }
    if (@ARGV > 0 && $ARGV[0] eq "--one-based") {
        $one_based = 1;
        shift @ARGV;
    }
}

if ($num_jobs != 0 && ($num_jobs < 0 || $job_id - $one_based < 0 || $job_id - $one_based >= $num_jobs)) {
    die "$0: invalid job number/index values for '-j $num_jobs $job_id" . ($one_based ? " --one-based" : "") . "'\n";
}
$job_id-- if $one_based;

if (($num_jobs == 0 && @ARGV < 2) || ($num_jobs > 0 && (@ARGV < 1 || @ARGV > 2))) {
    die "Usage: split_scp.pl [--utt2spk=<utt2spk>] <in.scp> <out1.scp> <out2.scp> ...\n" .
        "   or: split_scp.pl -j <num-jobs> <job-id> [--one-based] [--utt2spk=<utt2spk>] <in.scp> [<out.scp>]\n" .
        " where 0 <= job-id < num-jobs, or 1 <= job-id <= num-jobs with --one-based.\n";
}

my $inscp = shift @ARGV;
my @outputs;    # undef = a part that -j does not ask for
if ($num_jobs == 0) {
    @outputs = @ARGV;
} else {
    for my $j (0 .. $num_jobs - 1) {
        push @outputs, ($j == $job_id ? (@ARGV ? $ARGV[0] : "-") : undef);
    }
}
my $nparts = @outputs;

open(my $in, '<', $inscp) or die "$0: cannot open input $inscp: $!\n";
my @lines = <$in>;
close($in);

my @parts;    # list of array refs of lines
my $error = 0;
if ($utt2spk_file ne "") {
    my %utt2spk;
    open(my $u, '<', $utt2spk_file) or die "$0: cannot open utt2spk file $utt2spk_file: $!\n";
    while (my $line = <$u>) {
        my @f = split(" ", $line);
        @f == 2 or die "$0: $utt2spk_file:$.: expected '<utt> <spk>', got '" . _trim($line) . "'\n";
        $utt2spk{$f[0]} = $f[1];
    }
    close($u);
    my (@spks, %count, %data);
    for my $n (0 .. $#lines) {
        my @f = split(" ", $lines[$n]);
        @f > 0 or die "$0: $inscp:" . ($n + 1) . ": empty line\n";
        my $spk = $utt2spk{$f[0]};
        defined $spk or die "$0: $inscp:" . ($n + 1) . ": utterance '$f[0]' is not in $utt2spk_file\n";
        if (!exists $count{$spk}) { push @spks, $spk; $count{$spk} = 0; $data{$spk} = []; }
        $count{$spk}++;
        push @{$data{$spk}}, $lines[$n];
    }
    my $nspk = @spks;
    $nspk >= $nparts or die "$0: refusing to split: $nspk speakers in $inscp is fewer than $nparts parts\n";
    # First give each part a contiguous run of about nspk/nparts speakers ...
    my (@assign, @size);
    for my $p (0 .. $nparts - 1) { $assign[$p] = []; $size[$p] = 0; }
    for my $s (0 .. $nspk - 1) {
        my $p = int(($s * $nparts) / $nspk);
        push @{$assign[$p]}, $spks[$s];
        $size[$p] += $count{$spks[$s]};
    }
    # ... then move boundary speakers between neighbouring parts while that
    # reduces the difference of their utterance counts (this converges).
    my $changed = 1;
    while ($changed) {
        $changed = 0;
        for my $p (0 .. $nparts - 1) {
            if ($p < $nparts - 1 && @{$assign[$p]} > 0) {
                my $spk = $assign[$p][-1];
                my $c = $count{$spk};
                if (abs(($size[$p + 1] + $c) - ($size[$p] - $c)) < abs($size[$p + 1] - $size[$p])) {
                    $size[$p + 1] += $c; $size[$p] -= $c;
                    pop @{$assign[$p]}; unshift @{$assign[$p + 1]}, $spk;
                    $changed = 1;
                }
            }
            if ($p > 0 && @{$assign[$p]} > 0) {
                my $spk = $assign[$p][0];
                my $c = $count{$spk};
                if (abs(($size[$p] - $c) - ($size[$p - 1] + $c)) < abs($size[$p] - $size[$p - 1])) {
                    $size[$p - 1] += $c; $size[$p] -= $c;
                    shift @{$assign[$p]}; push @{$assign[$p - 1]}, $spk;
                    $changed = 1;
                }
            }
        }
    }
    for my $p (0 .. $nparts - 1) {
        $parts[$p] = [map { @{$data{$_}} } @{$assign[$p]}];
    }
} else {
    my $n = @lines;
    $n > 0 or die "$0: empty input $inscp\n";
    my $per = int($n / $nparts);
    $per >= 1 or die "$0: cannot split $n lines of $inscp into $nparts parts (reduce \$nj to at most $n)\n";
    my $rem = $n - $per * $nparts;
    my $i = 0;
    for my $p (0 .. $nparts - 1) {
        my $k = $per + ($p < $rem ? 1 : 0);
        $parts[$p] = [@lines[$i .. $i + $k - 1]];
        $i += $k;
    }
}

for my $p (0 .. $nparts - 1) {
    my $out = $outputs[$p];
    if (!@{$parts[$p]}) {
        print STDERR "$0: error: part " . ($p + 1) . " of $nparts" . (defined $out ? " ($out)" : "") .
            " is empty (too many parts for too few speakers?)\n";
        $error = 1;
    }
    write_part($out, $parts[$p]) if defined $out;
}
exit($error);

sub _trim { my $s = shift; chomp $s; return $s; }

# Writes lines to stdout ("-"), straight to a non-regular file (e.g. /dev/null),
# or atomically to a regular file.
sub write_part {
    my ($file, $lines) = @_;
    if ($file eq "-") {
        print STDOUT @$lines or die "$0: error writing to stdout: $!\n";
        return;
    }
    if (-e $file && !-f $file) {
        open(my $fh, '>', $file) or die "$0: cannot open $file for writing: $!\n";
        print $fh @$lines;
        close($fh) or die "$0: error closing $file: $!\n";
        return;
    }
    my $tmp = "$file.tmp.$$";
    open(my $fh, '>', $tmp) or die "$0: cannot open $tmp for writing: $!\n";
    print $fh @$lines or die "$0: error writing $tmp: $!\n";
    close($fh) or do { unlink $tmp; die "$0: error closing $tmp: $!\n"; };
    rename($tmp, $file) or do { unlink $tmp; die "$0: cannot rename $tmp to $file: $!\n"; };
}
