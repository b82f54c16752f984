#!/usr/bin/env perl
# Converts utt2spk ("<utt> <spk>" per line) to spk2utt ("<spk> <utt1> <utt2> ...").
# Speakers are printed in order of first appearance and utterances in input order,
# so a utt2spk sorted by utterance and speaker gives a sorted spk2utt.
#
# Usage: utt2spk_to_spk2utt.pl [utt2spk] > spk2utt      (reads stdin without a file)
#
# A line without exactly two fields is an error naming the file and line; nothing
# is printed then (the output is all or nothing).
use strict;
use warnings;

if (@ARGV > 1 || (@ARGV == 1 && $ARGV[0] =~ /^--?h(elp)?$/)) {
    die "Usage: utt2spk_to_spk2utt.pl [utt2spk] > spk2utt\n";
}

my (@order, %utts);
while (my $line = <>) {
    my @f = split(" ", $line);
    if (@f != 2) {
        my $name = ($ARGV eq "-" ? "stdin" : $ARGV);
        chomp $line;
        die "$0: $name:$.: expected '<utt> <spk>' (2 fields), got " . scalar(@f) . ": '$line'\n";
    }
    my ($utt, $spk) = @f;
    push @order, $spk unless exists $utts{$spk};
    push @{$utts{$spk}}, $utt;
}
print "$_ " . join(" ", @{$utts{$_}}) . "\n" for @order;
